"""The release of a workflow's children keeps its speed when the table's statistics were
taken while no task waited and every edge was resolved.

That is the state autovacuum last saw in a project whose workflows have all ended. The
planner then expects no ``WAITING`` task and no open edge; the release's statements, which
name their rows by id but also tested ``status = 'WAITING'`` and ``NOT resolved``, let it
pick the partial index of that state ("one row") and scan all of it for each batch, or each
cancelled child: a fan-out of 20,000 took 4 s per batch of 1,000 (past an ordinary
``statement_timeout``) and a failed parent's 20,000 children 3.7 s per batch, instead of
0.05 s and 0.11 s. The two functions now compare with a constant of their own, which a
generic plan cannot use to choose those indexes: every row is one primary-key probe.

The SQL is frozen here as it was when this migration was written (``django_pgtasks/sql/``
holds the current definition).
"""

import importlib

from django.db import migrations

RELEASE = r"""
CREATE OR REPLACE FUNCTION pgtasks_release(p_parents bigint[], p_limit integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    v_children bigint[];
    v_count integer;
    v_settled bigint[];
    v_ready bigint[];
    v_open CONSTANT boolean := false;
    v_waiting CONSTANT text := 'WAITING';
BEGIN
    WITH picked AS (
        SELECT d.id, r.parent_status
        FROM pgtasks_pending_release r
        CROSS JOIN LATERAL (
            SELECT e.id FROM pgtasks_dependency e
            WHERE e.parent_id = r.parent_id AND NOT e.resolved
            LIMIT p_limit) d
        WHERE r.parent_id = ANY (p_parents)
        LIMIT p_limit
    ), resolved AS (
        UPDATE pgtasks_dependency e SET resolved = true, parent_status = p.parent_status
        FROM picked p WHERE e.id = p.id AND e.resolved = v_open
        RETURNING e.child_id
    )
    SELECT array_agg(child_id ORDER BY child_id) INTO v_children FROM resolved;
    v_count := coalesce(cardinality(v_children), 0);
    IF v_count > 0 THEN
        PERFORM 1 FROM pgtasks_workflow_member
        WHERE task_id = ANY (v_children) ORDER BY task_id FOR NO KEY UPDATE;
        WITH lowered AS (
            UPDATE pgtasks_workflow_member m SET remaining = m.remaining - c.n
            FROM (SELECT child AS task_id, count(*)::integer AS n
                  FROM unnest(v_children) AS child GROUP BY child) c
            WHERE m.task_id = c.task_id
            RETURNING m.task_id, m.remaining
        )
        SELECT array_agg(task_id ORDER BY task_id) INTO v_settled
        FROM lowered WHERE remaining <= 0;
        IF v_settled IS NOT NULL THEN
            -- The common case in one statement: children whose parents all succeeded (or
            -- that run anyway) become READY. The rows are named by id on both sides and the
            -- status by v_waiting (above), so each is one primary-key probe: with only
            -- m.task_id = ANY (...), or with 'WAITING' written out, statistics that expect
            -- few WAITING rows made the planner scan every waiting task for the batch.
            WITH ready AS (
                UPDATE pgtasks_task t SET status = 'READY', finished_at = NULL,
                                          updated_at = statement_timestamp()
                FROM pgtasks_workflow_member m
                WHERE t.id = ANY (v_settled) AND m.task_id = ANY (v_settled)
                  AND t.id = m.task_id AND t.status = v_waiting
                  AND (m.on_parent_failure = 'run' OR NOT EXISTS (
                      SELECT 1 FROM pgtasks_dependency d
                      WHERE d.child_id = m.task_id
                        AND d.parent_status IS DISTINCT FROM 'SUCCESSFUL'))
                RETURNING t.id
            )
            SELECT array_agg(id) INTO v_ready FROM ready;
            -- The others end by their policy, each naming the parent that did not succeed.
            v_settled := ARRAY(SELECT unnest(v_settled)
                               EXCEPT SELECT unnest(coalesce(v_ready, '{}')));
            IF cardinality(v_settled) > 0 THEN
                PERFORM pgtasks_settle(v_settled);
            END IF;
        END IF;
    END IF;
    DELETE FROM pgtasks_pending_release r
    WHERE r.parent_id = ANY (p_parents)
      AND NOT EXISTS (SELECT 1 FROM pgtasks_dependency e
                      WHERE e.parent_id = r.parent_id AND NOT e.resolved);
    RETURN v_count;
END
$function$;
"""

SETTLE = r"""
CREATE OR REPLACE FUNCTION pgtasks_settle(p_children bigint[])
 RETURNS void
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    v_child record;
    v_failed text;
    v_status text;
    v_waiting CONSTANT text := 'WAITING';
BEGIN
    FOR v_child IN
        SELECT task_id, on_parent_failure FROM pgtasks_workflow_member
        WHERE task_id = ANY (p_children) AND remaining <= 0
        ORDER BY task_id
    LOOP
        SELECT 'task ' || parent_id || ' ended ' || coalesce(parent_status, 'DELETED')
        INTO v_failed
        FROM pgtasks_dependency
        WHERE child_id = v_child.task_id AND parent_status IS DISTINCT FROM 'SUCCESSFUL'
        ORDER BY child_id, parent_id LIMIT 1;
        v_status := CASE WHEN v_failed IS NULL OR v_child.on_parent_failure = 'run' THEN 'READY'
                         WHEN v_child.on_parent_failure = 'fail' THEN 'FAILED'
                         ELSE 'CANCELLED' END;
        UPDATE pgtasks_task SET
            status = v_status,
            finished_at = CASE WHEN v_status = 'READY' THEN NULL
                               ELSE statement_timestamp() END,
            error_text = CASE WHEN v_status = 'READY' THEN error_text
                              ELSE 'django_pgtasks.exceptions.ParentFailed: a task it depends '
                                   || 'on did not succeed (' || v_failed || ').' END,
            updated_at = statement_timestamp()
        WHERE id = v_child.task_id AND status = v_waiting;
    END LOOP;
END
$function$;
"""


def _reverse_sql() -> str:
    m16 = importlib.import_module("django_pgtasks.migrations.0016_deferred_release")
    m18 = importlib.import_module("django_pgtasks.migrations.0018_release_by_id")
    return m18.RELEASE + "\n" + m16._function(m16.MARK, "pgtasks_settle")


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0020_events_progress_log")]

    operations = [migrations.RunSQL(RELEASE + SETTLE, _reverse_sql(), elidable=False)]
