"""The check at the commit of an enqueue whose tasks wait for parents outside it (tasks
enqueued before) does its work once per parent, not once per child.

It ran for each such child: a lock of the parents in a subtransaction of its own (which
retries when a parent moves to history meanwhile), a flag, a count of those that ended. A
fan-out of 2,000 children of one existing task spent 3.2 s in its commit, and 9.9 s under
statistics that expect no open edge (the partial index of open edges scanned for each
child); 20,000 children meant 20,000 subtransactions. A parent found pending is now
remembered for the rest of the transaction (``pgtasks.pending_parents``, a
transaction-local setting): this transaction holds its lock until it commits, so it cannot
end before, and the next children that wait only for such parents return at once (the 64
most recent parents are kept, so that each check reads a short list). The open edges are
compared with a constant of the function's own, as in 0021.

The SQL is frozen here as it was when this migration was written (``django_pgtasks/sql/``
holds the current definition).
"""

import importlib

from django.db import migrations

COMMIT_CHECK = r"""
CREATE OR REPLACE FUNCTION pgtasks_member_committing()
 RETURNS trigger
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
DECLARE
    v_parents bigint[];
    v_locked bigint[];
    v_pending bigint[];
    v_tries integer := 0;
    v_open CONSTANT boolean := false;
BEGIN
    v_parents := ARRAY(
        SELECT d.parent_id FROM pgtasks_dependency d
        WHERE d.child_id = NEW.task_id AND d.resolved = v_open);
    v_pending := coalesce(
        nullif(current_setting('pgtasks.pending_parents', true), '')::bigint[], '{}');
    IF v_parents <@ v_pending THEN
        RETURN NULL;
    END IF;
    LOOP
        BEGIN
            v_locked := ARRAY(
                SELECT t.id FROM pgtasks_task t WHERE t.id = ANY (v_parents)
                ORDER BY t.id
                FOR NO KEY UPDATE OF t);
            EXIT;
        EXCEPTION WHEN serialization_failure THEN
            v_tries := v_tries + 1;
            IF v_tries > 100 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
    UPDATE pgtasks_task SET has_dependents = true
    WHERE id = ANY (v_locked) AND NOT has_dependents;
    PERFORM pgtasks_resolve_child(NEW.task_id, array_agg(t.id), array_agg(t.status::text))
    FROM pgtasks_task t
    WHERE t.id = ANY (v_locked) AND t.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')
    HAVING count(*) > 0;
    PERFORM pgtasks_resolve_child(NEW.task_id, array_agg(d.parent_id),
                                  array_agg('DELETED'::text))
    FROM pgtasks_dependency d
    WHERE d.child_id = NEW.task_id AND d.resolved = v_open
      AND NOT (d.parent_id = ANY (v_locked))
    HAVING count(*) > 0;
    PERFORM set_config('pgtasks.pending_parents', (ARRAY(
        SELECT t.id FROM pgtasks_task t
        WHERE t.id = ANY (v_locked) AND t.status IN ('WAITING', 'READY', 'RUNNING',
                                                     'AWAITING_RETRY')
          AND NOT (t.id = ANY (v_pending))) || v_pending)[1:64]::text, true);
    RETURN NULL;
END
$function$;
"""


def _reverse_sql() -> str:
    m16 = importlib.import_module("django_pgtasks.migrations.0016_deferred_release")
    return m16._function(m16.MARK, "pgtasks_member_committing")


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0021_release_under_stale_statistics")]

    operations = [migrations.RunSQL(COMMIT_CHECK, _reverse_sql(), elidable=False)]
