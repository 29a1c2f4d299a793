"""The release of a workflow's children names each settled child by id on both sides of its
UPDATE, so that every child is one primary-key probe whatever the table's statistics.

Right after a large fan-out is enqueued, autovacuum has not analyzed the task table yet and
the planner expects a handful of ``WAITING`` rows; joining on the member table's ids alone, it
scanned every waiting task against the whole batch (a batch of 1,000 children among 20,000
waiting ones: 19.5 million comparisons, 7 s, past an ordinary ``statement_timeout``).

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
        FROM picked p WHERE e.id = p.id AND NOT e.resolved
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
            -- that run anyway) become READY. The rows are named by id on both sides, so each
            -- is one primary-key probe: with only m.task_id = ANY (...), stale statistics
            -- right after a large fan-out was enqueued (few WAITING rows expected) made the
            -- planner scan every waiting task against the whole batch.
            WITH ready AS (
                UPDATE pgtasks_task t SET status = 'READY', finished_at = NULL,
                                          updated_at = statement_timestamp()
                FROM pgtasks_workflow_member m
                WHERE t.id = ANY (v_settled) AND m.task_id = ANY (v_settled)
                  AND t.id = m.task_id AND t.status = 'WAITING'
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


def _reverse_sql() -> str:
    m16 = importlib.import_module("django_pgtasks.migrations.0016_deferred_release")
    return m16._function(m16.MARK, "pgtasks_release")


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0017_dependency_open_index")]

    operations = [migrations.RunSQL(RELEASE, _reverse_sql(), elidable=False)]
