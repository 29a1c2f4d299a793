"""A release batch reads rows in proportion to the batch when a table's statistics were taken
after vacuum had emptied most of its pages without truncating it.

Such statistics (a quiet period after a large workflow) scale a handful of live rows to the
whole table, so after the next fan-out the planner expects a few edges, members and tasks
where there are thousands, and that any condition matches all of them. It joined the batch
with such a table by reading the table in full once per row of the batch (9 s for a batch
of 1,000 among 10,000 edges, past an ordinary ``statement_timeout``), and found a cancelled
child's failed parent by reading a whole index. Each statement of ``pgtasks_release`` and
``pgtasks_settle`` now reads one table, through an index its conditions name (sequential
scans off, per-row checks kept per row): whatever the planner expects, none reads more
than the rows it names.

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
 SET enable_seqscan TO 'off'
AS $function$
DECLARE
    v_edges bigint[];
    v_children bigint[];
    v_count integer;
    v_times integer;
    v_lowered bigint[];
    v_settled bigint[] := '{}';
    v_ready bigint[];
    v_open CONSTANT boolean := false;
    v_waiting CONSTANT text := 'WAITING';
BEGIN
    -- The batch: open edges of the locked marks' parents, through the index of open edges.
    v_edges := ARRAY(
        SELECT d.id
        FROM pgtasks_pending_release r
        CROSS JOIN LATERAL (
            SELECT e.id FROM pgtasks_dependency e
            WHERE e.parent_id = r.parent_id AND NOT e.resolved
            LIMIT p_limit) d
        WHERE r.parent_id = ANY (p_parents)
        LIMIT p_limit);
    -- Each edge takes its parent's end from the mark (locked by the caller: it cannot
    -- change or go before this transaction ends).
    WITH resolved AS (
        UPDATE pgtasks_dependency e SET resolved = true, parent_status = (
            SELECT r.parent_status FROM pgtasks_pending_release r
            WHERE r.parent_id = e.parent_id)
        WHERE e.id = ANY (v_edges) AND e.resolved = v_open
        RETURNING e.child_id
    )
    SELECT array_agg(child_id ORDER BY child_id) INTO v_children FROM resolved;
    v_count := coalesce(cardinality(v_children), 0);
    IF v_count > 0 THEN
        PERFORM 1 FROM pgtasks_workflow_member
        WHERE task_id = ANY (v_children) ORDER BY task_id FOR NO KEY UPDATE;
        -- A child is in v_children once per parent of the batch that it waits for: one
        -- statement per such count (almost always only 1).
        FOR v_times, v_lowered IN
            SELECT n, array_agg(child ORDER BY child)
            FROM (SELECT child, count(*)::integer AS n
                  FROM unnest(v_children) AS child GROUP BY child) c
            GROUP BY n
        LOOP
            WITH lowered AS (
                UPDATE pgtasks_workflow_member m SET remaining = m.remaining - v_times
                WHERE m.task_id = ANY (v_lowered)
                RETURNING m.task_id, m.remaining
            )
            SELECT v_settled || ARRAY(SELECT task_id FROM lowered WHERE remaining <= 0)
            INTO v_settled;
        END LOOP;
        IF cardinality(v_settled) > 0 THEN
            -- The common case in two statements: children whose parents all succeeded (or
            -- that run anyway) become READY. The status is compared with v_waiting (above).
            v_ready := ARRAY(
                SELECT m.task_id FROM pgtasks_workflow_member m
                WHERE m.task_id = ANY (v_settled)
                  AND (m.on_parent_failure = 'run' OR NOT EXISTS (
                      SELECT 1 FROM pgtasks_dependency d
                      WHERE d.child_id = m.task_id
                        AND d.parent_status IS DISTINCT FROM 'SUCCESSFUL' OFFSET 0)));
            WITH ready AS (
                UPDATE pgtasks_task t SET status = 'READY', finished_at = NULL,
                                          updated_at = statement_timestamp()
                WHERE t.id = ANY (v_ready) AND t.status = v_waiting
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
                      WHERE e.parent_id = r.parent_id AND NOT e.resolved OFFSET 0);
    RETURN v_count;
END
$function$;
"""

SETTLE = r"""
CREATE OR REPLACE FUNCTION pgtasks_settle(p_children bigint[])
 RETURNS void
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
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
        SELECT 'task ' || d.parent_id || ' ended ' || coalesce(d.parent_status, 'DELETED')
        INTO v_failed
        FROM (SELECT parent_id, parent_status FROM pgtasks_dependency
              WHERE child_id = v_child.task_id
                AND parent_status IS DISTINCT FROM 'SUCCESSFUL' OFFSET 0) d
        ORDER BY d.parent_id LIMIT 1;
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
    m21 = importlib.import_module("django_pgtasks.migrations.0021_release_under_stale_statistics")
    return m21.RELEASE + m21.SETTLE


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0022_commit_check_once_per_parent")]

    operations = [migrations.RunSQL(RELEASE + SETTLE, _reverse_sql(), elidable=False)]
