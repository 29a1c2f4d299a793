"""Deferred release: a parent's end writes a mark; workers release its children in batches.

Until now the transaction that ended a parent also released its children (migration 0013):
the outcome statement of a parent with 100,000 dependents lowered 100,000 counts, ran for
minutes, failed under an ordinary ``statement_timeout``, and a fault in the release failed
the parent's outcome itself. Now:

- A task with dependents that ends (or is deleted before it ends) writes one row into
  ``pgtasks_pending_release`` (its id and how it ended) and notifies the workers
  (``pgtasks`` channel, payload ``@release``): bounded work that cannot fail for the size of
  the fan-out.
- Workers release pending marks in transactions of a bounded number of edges
  (``pgtasks_release(parents, limit)``, run by django_pgtasks.lifecycle.release): each edge
  resolved with how its parent ended, counted off its child, and the children left with no
  parent settled as before (``pgtasks_settle``). A mark goes when its last edge is resolved.
  A mark whose release fails is retried later with back-off (``failures``, ``due_at``,
  ``last_error``), never by running a handler again.
- The commit-time check of a task enqueued after its parents resolves only that task's edges
  (``pgtasks_resolve_child``), not every edge of an ended parent.
- Re-opening a parent (an operator's retry) re-opens the whole downstream that ended: the
  children it moves back from history are re-opened in turn (before, only the direct
  children were, since the row triggers do not fire for a row moved back with no end time),
  and the pending marks of every re-opened task are dropped.
- Ends take the statement's time (``statement_timestamp()``), not the transaction's: the end
  of an ``atomic=True`` handler that ran for hours lands in the current history period, not
  in one that retention may have dropped meanwhile (docs/howto/history.md).

The SQL is frozen here as it was when this migration was written.
"""

import importlib

from django.db import migrations, models

# -- the pending marks ----------------------------------------------------------------------

MARK = r"""
-- A parent ended (p_status: how; DELETED if it was deleted before it ended): if some of its
-- edges are unresolved, leave a mark for the workers and wake them. Bounded work, whatever
-- the number of its dependents. A second end before the release (moved between history
-- tables) updates the status the remaining edges get.
CREATE FUNCTION pgtasks_mark_release(p_parent bigint, p_status text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pgtasks_dependency WHERE parent_id = p_parent AND NOT resolved)
    THEN
        INSERT INTO pgtasks_pending_release AS r (parent_id, parent_status, created_at, due_at,
                                                  failures, last_error)
        VALUES (p_parent, p_status, statement_timestamp(), statement_timestamp(), 0, '')
        ON CONFLICT (parent_id) DO UPDATE SET parent_status = EXCLUDED.parent_status,
                                              due_at = EXCLUDED.due_at;
        PERFORM pg_notify('pgtasks', '@release');
    END IF;
END
$$;

-- Settle the waiting tasks among p_children that have no parent left to wait for: READY if
-- every parent succeeded or its policy is 'run', else CANCELLED ('skip') or FAILED ('fail'),
-- naming the parent (of the lowest id) that did not succeed. Ending a task here leaves a mark
-- for its own dependents (the history triggers). As in 0013, with the statement's time.
CREATE OR REPLACE FUNCTION pgtasks_settle(p_children bigint[]) RETURNS void
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_child record;
    v_failed text;
    v_status text;
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
        WHERE id = v_child.task_id AND status = 'WAITING';
    END LOOP;
END
$$;

-- One batch of the release of the marked parents p_parents (locked by the caller): at most
-- p_limit of their unresolved edges are resolved with how their parent ended and counted off
-- their children (member rows locked in id order, so two batches never wait in a circle),
-- the children left with none are settled, and the marks with no edge left go. Returns the
-- number of edges resolved: the caller calls again while it is p_limit.
CREATE FUNCTION pgtasks_release(p_parents bigint[], p_limit integer) RETURNS integer
LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$
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
            -- that run anyway) become READY.
            WITH ready AS (
                UPDATE pgtasks_task t SET status = 'READY', finished_at = NULL,
                                          updated_at = statement_timestamp()
                FROM pgtasks_workflow_member m
                WHERE m.task_id = ANY (v_settled) AND t.id = m.task_id
                  AND t.status = 'WAITING'
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
$$;

-- The edges of one child to parents that ended before its enqueuing transaction committed:
-- resolved and counted off that child alone (the commit-time check below).
CREATE FUNCTION pgtasks_resolve_child(p_child bigint, p_parents bigint[], p_statuses text[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
    v_remaining integer;
BEGIN
    WITH resolved AS (
        UPDATE pgtasks_dependency e SET resolved = true, parent_status = p.status
        FROM unnest(p_parents, p_statuses) AS p(id, status)
        WHERE e.child_id = p_child AND e.parent_id = p.id AND NOT e.resolved
        RETURNING 1
    )
    SELECT count(*) INTO v_count FROM resolved;
    IF v_count > 0 THEN
        UPDATE pgtasks_workflow_member SET remaining = remaining - v_count
        WHERE task_id = p_child
        RETURNING remaining INTO v_remaining;
        IF v_remaining <= 0 THEN
            PERFORM pgtasks_settle(ARRAY[p_child]);
        END IF;
    END IF;
END
$$;

-- Parents p_parents ended before and wait or run again (an operator's retry): their pending
-- marks go, their resolved edges are counted back onto their children, and children that
-- were released or ended wait again with their attempts afresh; the children so re-opened
-- re-open their own children in turn, down the whole workflow (a diamond's join is counted
-- back once per re-opened parent: only resolved edges are). A child running at that moment
-- is left to finish.
CREATE OR REPLACE FUNCTION pgtasks_reopen(p_parents bigint[]) RETURNS void LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    v_todo bigint[] := coalesce(p_parents, '{}');
    v_parent bigint;
    v_children bigint[];
    v_next bigint[];
BEGIN
    WHILE cardinality(v_todo) > 0 LOOP
        v_parent := v_todo[1];
        v_todo := v_todo[2:];
        DELETE FROM pgtasks_pending_release WHERE parent_id = v_parent;
        WITH reopened AS (
            UPDATE pgtasks_dependency SET resolved = false, parent_status = NULL
            WHERE parent_id = v_parent AND resolved
            RETURNING child_id
        )
        SELECT array_agg(child_id ORDER BY child_id) INTO v_children FROM reopened;
        CONTINUE WHEN v_children IS NULL;
        UPDATE pgtasks_workflow_member SET remaining = remaining + 1
        WHERE task_id = ANY (v_children);
        WITH waiting AS (
            UPDATE pgtasks_task SET
                status = 'WAITING', attempt = 0, interruptions = 0, started_at = NULL,
                finished_at = NULL, error_text = '', result = NULL, cancel_requested = false,
                updated_at = statement_timestamp()
            WHERE id = ANY (v_children)
              AND status IN ('READY', 'AWAITING_RETRY', 'SUCCESSFUL', 'FAILED', 'CANCELLED')
            RETURNING id, has_dependents
        )
        SELECT array_agg(id ORDER BY id) INTO v_next FROM waiting WHERE has_dependents;
        IF v_next IS NOT NULL THEN
            v_todo := v_todo || v_next;
        END IF;
    END LOOP;
END
$$;

-- A row entering history: announce the end to whoever waits for it, free its concurrency
-- key, and leave a release mark for its dependents (0014 released them here).
CREATE OR REPLACE FUNCTION pgtasks_task_entered_history() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.awaited THEN
        PERFORM pg_notify('pgtasks_finished', NEW.id::text);
    END IF;
    IF NEW.concurrency_key IS NOT NULL THEN
        PERFORM pg_notify('pgtasks', NEW.queue);
    END IF;
    IF NEW.has_dependents THEN
        PERFORM pgtasks_mark_release(NEW.id, NEW.status::text);
    END IF;
    RETURN NULL;
END
$$;

-- A task with dependents deleted before it ended (a row moving to history is found again
-- there and left to the trigger above), ended in place, or requeued.
CREATE OR REPLACE FUNCTION pgtasks_parent_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF NOT EXISTS (SELECT 1 FROM pgtasks_task WHERE id = OLD.id) THEN
            PERFORM pgtasks_mark_release(OLD.id, 'DELETED');
        END IF;
    ELSIF NEW.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED') THEN
        PERFORM pgtasks_mark_release(NEW.id, NEW.status::text);
    ELSE
        PERFORM pgtasks_reopen(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END
$$;

-- The check at the commit of a transaction that enqueued a task with parents saved before
-- it (0013, 0014): lock those parents in id order, flag them has_dependents, and resolve this
-- task's edges to those that ended before the lock (or are gone) - this task's alone.
CREATE OR REPLACE FUNCTION pgtasks_member_committing() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_parents bigint[];
    v_locked bigint[];
    v_tries integer := 0;
BEGIN
    v_parents := ARRAY(
        SELECT d.parent_id FROM pgtasks_dependency d
        WHERE d.child_id = NEW.task_id AND NOT d.resolved);
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
    WHERE d.child_id = NEW.task_id AND NOT d.resolved AND NOT (d.parent_id = ANY (v_locked))
    HAVING count(*) > 0;
    RETURN NULL;
END
$$;

-- An end written without finished_at (operator SQL) takes the statement's time.
CREATE OR REPLACE FUNCTION pgtasks_task_ending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.finished_at := statement_timestamp();
    RETURN NEW;
END
$$;

DROP FUNCTION pgtasks_resolve(bigint[], text[]);
"""


def _function(sql: str, name: str) -> str:
    """The CREATE [OR REPLACE] FUNCTION ``name`` statement of an older migration's text, as a
    CREATE OR REPLACE (for the way back)."""
    start = sql.index(f"FUNCTION {name}(")
    start = sql.rindex("CREATE", 0, start)
    body = sql[start : sql.index("$$;", sql.index("$$", sql.index(" AS $$", start) + 6)) + 3]
    return "CREATE OR REPLACE FUNCTION" + body.split("FUNCTION", 1)[1]


def _reverse_sql() -> str:
    m13 = importlib.import_module("django_pgtasks.migrations.0013_workflows")
    m14 = importlib.import_module("django_pgtasks.migrations.0014_partitioned_history")
    release = m13.RELEASE
    triggers = m14._fmt(m14.TRIGGERS)
    return "\n".join(
        [
            _function(release, "pgtasks_resolve").replace(
                "CREATE OR REPLACE FUNCTION", "CREATE FUNCTION", 1
            ),
            _function(release, "pgtasks_settle"),
            _function(release, "pgtasks_reopen"),
            _function(triggers, "pgtasks_task_entered_history"),
            _function(triggers, "pgtasks_parent_changed"),
            _function(triggers, "pgtasks_member_committing"),
            _function(triggers, "pgtasks_task_ending"),
            "DROP FUNCTION pgtasks_resolve_child(bigint, bigint[], text[]);",
            "DROP FUNCTION pgtasks_release(bigint[], integer);",
            "DROP FUNCTION pgtasks_mark_release(bigint, text);",
        ]
    )


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0015_enqueue_function")]

    operations = [
        migrations.CreateModel(
            name="PendingRelease",
            fields=[
                (
                    "parent_id",
                    models.BigIntegerField(
                        primary_key=True, serialize=False, verbose_name="ended task"
                    ),
                ),
                (
                    "parent_status",
                    models.CharField(
                        help_text="SUCCESSFUL, FAILED or CANCELLED; DELETED for a task deleted "
                        "before it ended.",
                        max_length=16,
                        verbose_name="how it ended",
                    ),
                ),
                ("created_at", models.DateTimeField(verbose_name="ended at")),
                (
                    "due_at",
                    models.DateTimeField(
                        help_text="A release that failed is tried again from this time.",
                        verbose_name="next try",
                    ),
                ),
                ("failures", models.IntegerField(default=0, verbose_name="failed tries")),
                ("last_error", models.TextField(blank=True, default="", verbose_name="last error")),
            ],
            options={
                "verbose_name": "pending release",
                "verbose_name_plural": "pending releases",
                "db_table": "pgtasks_pending_release",
                "indexes": [models.Index(fields=["due_at"], name="pgtasks_release_due_idx")],
            },
        ),
        migrations.RunSQL(MARK, _reverse_sql(), elidable=False),
    ]
