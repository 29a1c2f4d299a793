"""Partitioned history: the task table becomes a partitioned table, split by state.

``pgtasks_task`` stays the table every query names, now partitioned by ``status`` (LIST):

- ``pgtasks_task_live``: waiting and running tasks (``WAITING``, ``READY``, ``RUNNING``,
  ``AWAITING_RETRY``). It stays small whatever the history, so claims, heartbeats and rescue
  read a small table; it carries the claim's indexes and the key's unique index, and is tuned
  for churn (fillfactor and autovacuum settings below).
- ``pgtasks_task_done`` (``SUCCESSFUL``, ``CANCELLED``) and ``pgtasks_task_failed``
  (``FAILED``): the history, each partitioned by ``finished_at`` (RANGE), so that retention
  drops whole partitions (django_pgtasks.patterns.partitions). Each has a ``_before``
  partition (from MINVALUE), one per day from the current one to three days ahead, and an
  ``_after`` partition (to MAXVALUE): every time has a partition, so a missing partition
  never fails an outcome; the workers' maintenance makes the next periods ahead.

A task moves to history in the transaction of its outcome: the outcome's UPDATE makes
PostgreSQL move the row (a DELETE from the live partition and an INSERT into the history's).
Row-level AFTER UPDATE triggers do not fire for a moved row, so the triggers that watch a
task end or come back are re-attached here to the INSERT into history and back into the live
partition (see TRIGGERS).

Upgrading an existing table, without a long lock (atomic = False, each step its own
transaction):

1. the history tables are made beside the old table, each with CHECK constraints that prove
   its partition bounds, so attaching them later scans nothing;
2. finished rows move from the old table to them in batches of BATCH rows (DELETE ...
   RETURNING feeding the INSERT, one statement, in id order), the cascade trigger told not to
   drop the moved tasks' workflow edges; then the old table is vacuumed;
3. one short transaction locks the old table, moves the rows that finished meanwhile, copies
   the live rows (found through their partial indexes) into the new live partition, drops the
   old table and puts the partitioned table in its place under the same name, with the same
   id sequence position. Its length is that of the live rows and the few late finishers.

While step 2 runs, finished tasks already moved are not visible through ``pgtasks_task``;
they are again when the migration ends. Processes of the previous version keep working
against the new table, except that a keyed enqueue (``INSERT ... ON CONFLICT (key)``) fails
until they are restarted: the partitioned parent cannot carry the live partition's unique
index.

Downgrading (``migrate django_pgtasks 0013``) copies every row back into a plain table under
an exclusive lock: purge the history first on a large install (docs/howto/history.md).

The SQL is frozen here as it was when this migration was written.
"""

import importlib

from django.db import migrations, transaction

# 0009's controlled claim returns rows of pgtasks_task, so it goes with the old table and comes
# back on the new one, reading and claiming from the live partition: every row it reads is
# live, and a lookup by id on the parent would probe every history partition.
_CLAIM_FUNCTION = importlib.import_module("django_pgtasks.migrations.0009_claims").CLAIM_FUNCTION
CLAIM_FUNCTION = (
    _CLAIM_FUNCTION.replace("FROM pgtasks_task\n", "FROM pgtasks_task_live\n")
    .replace("FROM pgtasks_task ", "FROM pgtasks_task_live ")
    .replace("UPDATE pgtasks_task t", "UPDATE pgtasks_task_live t")
)
DROP_CLAIM_FUNCTION = "DROP FUNCTION pgtasks_claim_controlled(text[], integer, text, integer);"

# 0013's check at the commit of an enqueue of a task with parents, as it was (for the way back).
_RELEASE = importlib.import_module("django_pgtasks.migrations.0013_workflows").RELEASE
_start = _RELEASE.index("CREATE FUNCTION pgtasks_member_committing()")
MEMBER_COMMITTING_0013 = (
    "CREATE OR REPLACE "
    + _RELEASE[_start + len("CREATE ") : _RELEASE.index("$$;", _start) + len("$$;")]
)

#: Rows per transaction when moving finished rows out of the old table.
BATCH = 10_000

LIVE = "'WAITING', 'READY', 'RUNNING', 'AWAITING_RETRY'"
DONE = "'SUCCESSFUL', 'CANCELLED'"
FAILED = "'FAILED'"
ENDED = "'SUCCESSFUL', 'FAILED', 'CANCELLED'"

# -- step 1: the history tables, beside the old one ------------------------------------------
#
# Partitioned by finished_at; a row without one (a task ended before finished_at was always
# written) is given its updated_at when it moves. The CHECKs prove the LIST bounds of the
# future parent, so attaching scans nothing. The id index serves lookups by id (results,
# the admin); pgtasks_task_finished_idx's twin lets the parent's index attach without a build.
HISTORY_SQL = """
CREATE TABLE pgtasks_task_{kind} (LIKE pgtasks_task INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                                  INCLUDING STORAGE,
    CONSTRAINT pgtasks_task_{kind}_status CHECK (status IN ({statuses})),
    CONSTRAINT pgtasks_task_{kind}_finished CHECK (finished_at IS NOT NULL)
) PARTITION BY RANGE (finished_at);
ALTER TABLE pgtasks_task_{kind} ALTER COLUMN id DROP DEFAULT;
CREATE INDEX pgtasks_task_{kind}_id_idx ON pgtasks_task_{kind} (id);
CREATE INDEX pgtasks_task_{kind}_finished_idx ON pgtasks_task_{kind} (finished_at)
    WHERE status IN ({ended});
CREATE TABLE pgtasks_task_{kind}_before PARTITION OF pgtasks_task_{kind}
    FOR VALUES FROM (MINVALUE) TO ('{start}');
CREATE TABLE pgtasks_task_{kind}_after PARTITION OF pgtasks_task_{kind}
    FOR VALUES FROM ('{end}') TO (MAXVALUE);
"""
# One period of a day (the default PGTASKS["HISTORY_PERIOD"]); the workers make the next.
PERIOD_SQL = """
CREATE TABLE pgtasks_task_{kind}_p{name} PARTITION OF pgtasks_task_{kind}
    FOR VALUES FROM ('{start}') TO ('{end}');
"""
#: Periods made by the migration: the current day and the next three (the default
#: PGTASKS["HISTORY_PREMAKE"]), so that the check of their reach holds before any worker ran.
DAYS = 4

# History tables are appended to and never updated in place: vacuum them for their
# visibility map (index-only counts in the admin), not for dead rows.
HISTORY_STORAGE = """
ALTER TABLE pgtasks_task_{kind}_{part} SET (autovacuum_vacuum_insert_scale_factor = 0.05,
                                           autovacuum_analyze_scale_factor = 0.05);
"""

# The cascade trigger (0013) drops the workflow rows of deleted tasks: not of moved ones.
CASCADE_AWARE = """
CREATE OR REPLACE FUNCTION pgtasks_tasks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('pgtasks.moving_history', true) = 'on' THEN
        RETURN NULL;
    END IF;
    DELETE FROM pgtasks_dependency d USING pgtasks_deleted_tasks g WHERE d.child_id = g.id;
    DELETE FROM pgtasks_workflow_member m USING pgtasks_deleted_tasks g WHERE m.task_id = g.id;
    RETURN NULL;
END
$$;
"""

# -- step 2: a batch of finished rows, in id order --------------------------------------------
MOVE_BATCH_SQL = """
WITH moved AS (
    DELETE FROM pgtasks_task WHERE id IN (
        SELECT id FROM pgtasks_task
        WHERE id > %s AND status IN ({ended})
        ORDER BY id LIMIT %s
        FOR UPDATE SKIP LOCKED)
    RETURNING *
), done AS (
    INSERT INTO pgtasks_task_done ({columns}) SELECT {values} FROM moved
    WHERE status IN ({done})
), failed AS (
    INSERT INTO pgtasks_task_failed ({columns}) SELECT {values} FROM moved
    WHERE status IN ({failed})
)
SELECT count(*), max(id) FROM moved
"""

# -- step 3: the swap -------------------------------------------------------------------------
# The rows that ended since their batch passed (or were locked then): through the finished
# index, which the vacuum emptied of the moved rows' entries.
MOVE_REST_SQL = """
WITH moved AS (
    DELETE FROM pgtasks_task WHERE status IN ({ended}) RETURNING *
), done AS (
    INSERT INTO pgtasks_task_done ({columns}) SELECT {values} FROM moved
    WHERE status IN ({done})
)
INSERT INTO pgtasks_task_failed ({columns}) SELECT {values} FROM moved
WHERE status IN ({failed})
"""

SWAP_SQL = """
CREATE TEMPORARY TABLE pgtasks_live_copy ON COMMIT DROP AS
    SELECT * FROM pgtasks_task WHERE status IN ('READY', 'AWAITING_RETRY')
    UNION ALL SELECT * FROM pgtasks_task WHERE status = 'RUNNING'
    UNION ALL SELECT * FROM pgtasks_task WHERE status = 'WAITING';
CREATE TEMPORARY TABLE pgtasks_next_id ON COMMIT DROP AS
    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END AS next
    FROM pgtasks_task_id_seq;
DROP TABLE pgtasks_task;

CREATE TABLE pgtasks_task (LIKE pgtasks_task_done INCLUDING DEFAULTS INCLUDING STORAGE,
    CONSTRAINT pgtasks_task_attempt_check CHECK (attempt >= 0),
    CONSTRAINT pgtasks_task_claims_check CHECK (claims >= 0),
    CONSTRAINT pgtasks_task_concurrency_limit_check CHECK (concurrency_limit >= 0),
    CONSTRAINT pgtasks_task_interruptions_check CHECK (interruptions >= 0),
    CONSTRAINT pgtasks_task_max_attempts_check CHECK (max_attempts >= 0),
    CONSTRAINT pgtasks_task_max_attempts_min CHECK (max_attempts >= 1),
    CONSTRAINT pgtasks_task_priority_range CHECK (priority >= 0 AND priority <= 200),
    CONSTRAINT pgtasks_task_status_valid CHECK (status IN (
        'WAITING', 'READY', 'RUNNING', 'AWAITING_RETRY', 'SUCCESSFUL', 'FAILED', 'CANCELLED'))
) PARTITION BY LIST (status);
CREATE SEQUENCE pgtasks_task_id_seq OWNED BY pgtasks_task.id;
SELECT setval('pgtasks_task_id_seq', next, false) FROM pgtasks_next_id;
ALTER TABLE pgtasks_task ALTER COLUMN id SET DEFAULT nextval('pgtasks_task_id_seq');

-- The live partition churns: every row is inserted, updated by its claim and deleted (moved)
-- at its end, so dead rows pile up at the pace of the queue while live rows stay few. Vacuum
-- it after 1,000 dead rows plus 2% (not the default 20% of a table whose size swings), at
-- full speed (small table, no cost delay); leave 10% of each page free so that a claim's new
-- row version fits on its page.
CREATE TABLE pgtasks_task_live PARTITION OF pgtasks_task (
    CONSTRAINT pgtasks_task_live_pkey PRIMARY KEY (id)
) FOR VALUES IN ({live})
WITH (fillfactor = 90, autovacuum_vacuum_scale_factor = 0.02,
      autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.05,
      autovacuum_analyze_threshold = 1000, autovacuum_vacuum_cost_delay = 0);
INSERT INTO pgtasks_task_live SELECT * FROM pgtasks_live_copy;

-- The indexes of the live states live on the live partition, under the names the model
-- declares (the key's unique index cannot be on the parent: it would have to include status).
CREATE INDEX pgtasks_task_claim_idx ON pgtasks_task_live (queue, priority DESC, run_after, id)
    WHERE status IN ('READY', 'AWAITING_RETRY');
CREATE INDEX pgtasks_task_running_idx ON pgtasks_task_live (locked_at) WHERE status = 'RUNNING';
CREATE INDEX pgtasks_task_waiting_idx ON pgtasks_task_live (queue) WHERE status = 'WAITING';
CREATE INDEX pgtasks_task_key_running_idx ON pgtasks_task_live (concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status = 'RUNNING';
CREATE INDEX pgtasks_task_key_pending_idx ON pgtasks_task_live (queue, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status IN ('READY', 'AWAITING_RETRY');
CREATE UNIQUE INDEX pgtasks_task_live_key_uniq ON pgtasks_task_live (key)
    WHERE key IS NOT NULL AND status IN ('READY', 'AWAITING_RETRY', 'RUNNING');

-- The finished index on the parent: the history tables' twins attach to it.
CREATE INDEX pgtasks_task_finished_idx ON pgtasks_task (finished_at) WHERE status IN ({ended});
ALTER TABLE pgtasks_task ATTACH PARTITION pgtasks_task_done FOR VALUES IN ({done});
ALTER TABLE pgtasks_task ATTACH PARTITION pgtasks_task_failed FOR VALUES IN ({failed});
"""

# -- the triggers, on the partitioned table -------------------------------------------------
TRIGGERS = """
-- 0004: a statement that inserts tasks wakes the workers of their queues. Statement triggers
-- fire for the table a statement names: enqueue names the live partition, other inserts the
-- parent.
CREATE TRIGGER pgtasks_task_notify_inserted
    AFTER INSERT ON pgtasks_task
    REFERENCING NEW TABLE AS pgtasks_new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtasks_notify_inserted();
CREATE TRIGGER pgtasks_task_live_notify_inserted
    AFTER INSERT ON pgtasks_task_live
    REFERENCING NEW TABLE AS pgtasks_new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtasks_notify_inserted();

-- Updates that keep a row in its partition (retries, snoozes, rescue, operator actions on
-- live tasks): as in 0004, 0006 and 0007.
CREATE TRIGGER pgtasks_task_notify_updated
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.status IN ('READY', 'AWAITING_RETRY')
          AND (OLD.status IS DISTINCT FROM NEW.status
               OR OLD.run_after IS DISTINCT FROM NEW.run_after
               OR OLD.queue IS DISTINCT FROM NEW.queue))
    EXECUTE FUNCTION pgtasks_notify_updated();
CREATE TRIGGER pgtasks_task_notify_key_freed
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'RUNNING'
          AND NEW.status <> 'RUNNING')
    EXECUTE FUNCTION pgtasks_notify_key_freed();
CREATE TRIGGER pgtasks_task_notify_cancel
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.cancel_requested AND NOT OLD.cancel_requested AND NEW.status = 'RUNNING')
    EXECUTE FUNCTION pgtasks_notify_cancel();
CREATE TRIGGER pgtasks_task_notify_finished
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.awaited AND NEW.status IN ({ended}) AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION pgtasks_notify_finished();

-- A row entering history (its task ended: moved out of the live partition, or between the
-- history tables): announce the end to whoever waits for it, free its concurrency key, and
-- resolve the edges of its dependents (pgtasks_resolve leaves resolved edges alone, so a
-- second entry changes nothing). Only rows with one of the three flags reach the function.
CREATE FUNCTION pgtasks_task_entered_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.awaited THEN
        PERFORM pg_notify('pgtasks_finished', NEW.id::text);
    END IF;
    IF NEW.concurrency_key IS NOT NULL THEN
        PERFORM pg_notify('pgtasks', NEW.queue);
    END IF;
    IF NEW.has_dependents THEN
        PERFORM pgtasks_resolve(ARRAY[NEW.id], ARRAY[NEW.status::text]);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER pgtasks_task_done_entered
    AFTER INSERT ON pgtasks_task_done
    FOR EACH ROW
    WHEN (NEW.awaited OR NEW.has_dependents OR NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION pgtasks_task_entered_history();
CREATE TRIGGER pgtasks_task_failed_entered
    AFTER INSERT ON pgtasks_task_failed
    FOR EACH ROW
    WHEN (NEW.awaited OR NEW.has_dependents OR NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION pgtasks_task_entered_history();

-- A row coming back from history (an operator retried a finished task): wake the workers of
-- its queue and re-open the edges of its dependents. Rows enqueued afresh have no
-- finished_at and pass by.
CREATE FUNCTION pgtasks_task_left_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IN ('READY', 'AWAITING_RETRY') THEN
        PERFORM pgtasks_notify_updated_row(NEW.queue, NEW.run_after);
    END IF;
    IF NEW.has_dependents THEN
        PERFORM pgtasks_reopen(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END
$$;
CREATE FUNCTION pgtasks_notify_updated_row(p_queue text, p_run_after timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    IF p_run_after <= statement_timestamp() THEN
        PERFORM pg_notify('pgtasks', p_queue);
    ELSE
        PERFORM pg_notify('pgtasks', p_queue || '@'
                          || extract(epoch FROM p_run_after - statement_timestamp())::text);
    END IF;
END
$$;
CREATE TRIGGER pgtasks_task_live_returned
    AFTER INSERT ON pgtasks_task_live
    FOR EACH ROW
    WHEN (NEW.finished_at IS NOT NULL)
    EXECUTE FUNCTION pgtasks_task_left_history();

-- A task with dependents deleted before it ended: its dependents see it gone. The live
-- partition's DELETE also fires for a row moving to history; such a row is found again (in
-- history) and left to the INSERT trigger above.
CREATE OR REPLACE FUNCTION pgtasks_parent_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF NOT EXISTS (SELECT 1 FROM pgtasks_task WHERE id = OLD.id) THEN
            PERFORM pgtasks_resolve(ARRAY[OLD.id], ARRAY['DELETED']);
        END IF;
    ELSIF NEW.status IN ({ended}) THEN
        PERFORM pgtasks_resolve(ARRAY[NEW.id], ARRAY[NEW.status::text]);
    ELSE
        PERFORM pgtasks_reopen(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER pgtasks_task_parent_deleted
    AFTER DELETE ON pgtasks_task_live
    FOR EACH ROW
    WHEN (OLD.has_dependents)
    EXECUTE FUNCTION pgtasks_parent_changed();

-- 0013's check at the commit of an enqueue of a task with parents, which locks the parents:
-- a parent that ends (moves to history) while the lock waits makes the lock fail instead of
-- following the row (a serialization failure); lock them again, where they are now. Each
-- failure means that a parent ended meanwhile, so the retries are bounded by the parents.
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
    v_parents := v_locked;
    UPDATE pgtasks_task SET has_dependents = true
    WHERE id = ANY (v_parents) AND NOT has_dependents;
    PERFORM pgtasks_resolve(array_agg(t.id), array_agg(t.status::text))
    FROM pgtasks_task t
    WHERE t.id = ANY (v_parents) AND t.status IN ({ended})
    HAVING count(*) > 0;
    PERFORM pgtasks_resolve(array_agg(d.parent_id), array_agg('DELETED'::text))
    FROM pgtasks_dependency d
    WHERE d.child_id = NEW.task_id AND NOT d.resolved AND NOT (d.parent_id = ANY (v_parents))
    HAVING count(*) > 0;
    RETURN NULL;
END
$$;

-- An end written without finished_at (operator SQL) still has a place in history.
CREATE FUNCTION pgtasks_task_ending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.finished_at := now();
    RETURN NEW;
END
$$;
CREATE TRIGGER pgtasks_task_ending
    BEFORE UPDATE ON pgtasks_task_live
    FOR EACH ROW
    WHEN (NEW.finished_at IS NULL AND NEW.status IN ({ended}))
    EXECUTE FUNCTION pgtasks_task_ending();

-- 0013: workflow rows go with deleted tasks, and with a TRUNCATE.
CREATE TRIGGER pgtasks_task_deleted
    AFTER DELETE ON pgtasks_task
    REFERENCING OLD TABLE AS pgtasks_deleted_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtasks_tasks_deleted();
CREATE TRIGGER pgtasks_task_truncated
    AFTER TRUNCATE ON pgtasks_task
    FOR EACH STATEMENT EXECUTE FUNCTION pgtasks_tasks_truncated();
"""


def _fmt(sql: str, **extra: str) -> str:
    return sql.format(live=LIVE, done=DONE, failed=FAILED, ended=ENDED, **extra)


def _columns(cursor) -> tuple[str, str]:
    cursor.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'pgtasks_task'::regclass "
        "AND attnum > 0 AND NOT attisdropped ORDER BY attnum"
    )
    names = [row[0] for row in cursor.fetchall()]
    columns = ", ".join(f'"{n}"' for n in names)
    values = ", ".join(
        "coalesce(finished_at, updated_at)" if n == "finished_at" else f'"{n}"' for n in names
    )
    return columns, values


def forward(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = 'pgtasks_task'::regclass")
        if cursor.fetchone()[0] == "p":  # a run stopped after its swap: only ANALYZE was left
            cursor.execute("ANALYZE pgtasks_task")
            return
        # 1. the history tables; the first period starts with the current day (UTC)
        cursor.execute(
            "SELECT d, d + interval '1 day', to_char(d AT TIME ZONE 'UTC', 'YYYYMMDD') "
            "FROM generate_series(date_trunc('day', now(), 'UTC'), "
            "date_trunc('day', now(), 'UTC') + (%s - 1) * interval '1 day', "
            "interval '1 day') AS d",
            [DAYS],
        )
        days = cursor.fetchall()
        cursor.execute("SELECT to_regclass('pgtasks_task_done') IS NULL")
        fresh = cursor.fetchone()[0]  # else a run stopped after step 1: carry on from there
        with transaction.atomic(using=connection.alias):
            for kind, statuses in (("done", DONE), ("failed", FAILED)) if fresh else ():
                cursor.execute(
                    _fmt(
                        HISTORY_SQL,
                        kind=kind,
                        statuses=statuses,
                        start=days[0][0].isoformat(),
                        end=days[-1][1].isoformat(),
                    )
                )
                for start, end, name in days:
                    cursor.execute(
                        PERIOD_SQL.format(
                            kind=kind, name=name, start=start.isoformat(), end=end.isoformat()
                        )
                    )
                for part in ("before", "after", *(f"p{name}" for _s, _e, name in days)):
                    cursor.execute(HISTORY_STORAGE.format(kind=kind, part=part))
            cursor.execute(CASCADE_AWARE)
        columns, values = _columns(cursor)
        # 2. finished rows in batches, each its own transaction
        batch_sql = _fmt(MOVE_BATCH_SQL, columns=columns, values=values)
        after = 0
        while True:
            with transaction.atomic(using=connection.alias):
                cursor.execute("SET LOCAL pgtasks.moving_history = 'on'")
                cursor.execute(batch_sql, [after, BATCH])
                moved, last = cursor.fetchone()
            if not moved:
                break
            after = last
        cursor.execute("VACUUM (ANALYZE) pgtasks_task")
        # 3. the swap, in one short transaction
        with transaction.atomic(using=connection.alias):
            cursor.execute("SET LOCAL lock_timeout = '10s'")
            cursor.execute("LOCK TABLE pgtasks_task IN ACCESS EXCLUSIVE MODE")
            cursor.execute("SET LOCAL pgtasks.moving_history = 'on'")
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(_fmt(MOVE_REST_SQL, columns=columns, values=values))
            cursor.execute(DROP_CLAIM_FUNCTION)
            cursor.execute(_fmt(SWAP_SQL))
            cursor.execute(CLAIM_FUNCTION)
            cursor.execute("RESET enable_seqscan")
            cursor.execute(_fmt(TRIGGERS))
        cursor.execute("ANALYZE pgtasks_task")


# -- downgrade: one plain table again, with 0013's indexes and triggers ---------------------
REVERSE_SQL = """
LOCK TABLE pgtasks_task IN ACCESS EXCLUSIVE MODE;
CREATE TEMPORARY TABLE pgtasks_next_id ON COMMIT DROP AS
    SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END AS next
    FROM pgtasks_task_id_seq;
CREATE TABLE pgtasks_task_plain (LIKE pgtasks_task INCLUDING DEFAULTS INCLUDING CONSTRAINTS
                                 INCLUDING STORAGE);
ALTER TABLE pgtasks_task_plain ALTER COLUMN id DROP DEFAULT;
INSERT INTO pgtasks_task_plain SELECT * FROM pgtasks_task;
DROP FUNCTION pgtasks_claim_controlled(text[], integer, text, integer);
DROP TABLE pgtasks_task;
DROP FUNCTION IF EXISTS pgtasks_task_entered_history();
DROP FUNCTION IF EXISTS pgtasks_task_left_history();
DROP FUNCTION IF EXISTS pgtasks_notify_updated_row(text, timestamptz);
DROP FUNCTION IF EXISTS pgtasks_task_ending();
ALTER TABLE pgtasks_task_plain RENAME TO pgtasks_task;
ALTER TABLE pgtasks_task ADD CONSTRAINT pgtasks_task_pkey PRIMARY KEY (id);
ALTER TABLE pgtasks_task ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY;
SELECT setval(pg_get_serial_sequence('pgtasks_task', 'id'), next, false) FROM pgtasks_next_id;
ALTER TABLE pgtasks_task SET (autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1);
CREATE INDEX pgtasks_task_claim_idx ON pgtasks_task (queue, priority DESC, run_after, id)
    WHERE status IN ('READY', 'AWAITING_RETRY');
CREATE INDEX pgtasks_task_running_idx ON pgtasks_task (locked_at) WHERE status = 'RUNNING';
CREATE INDEX pgtasks_task_finished_idx ON pgtasks_task (finished_at) WHERE status IN ({ended});
CREATE INDEX pgtasks_task_waiting_idx ON pgtasks_task (queue) WHERE status = 'WAITING';
CREATE INDEX pgtasks_task_key_running_idx ON pgtasks_task (concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status = 'RUNNING';
CREATE INDEX pgtasks_task_key_pending_idx ON pgtasks_task (queue, concurrency_key)
    WHERE concurrency_key IS NOT NULL AND status IN ('READY', 'AWAITING_RETRY');
CREATE UNIQUE INDEX pgtasks_task_live_key_uniq ON pgtasks_task (key)
    WHERE key IS NOT NULL AND status IN ('READY', 'AWAITING_RETRY', 'RUNNING');

CREATE OR REPLACE FUNCTION pgtasks_tasks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM pgtasks_dependency d USING pgtasks_deleted_tasks g WHERE d.child_id = g.id;
    DELETE FROM pgtasks_workflow_member m USING pgtasks_deleted_tasks g WHERE m.task_id = g.id;
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION pgtasks_parent_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM pgtasks_resolve(ARRAY[OLD.id], ARRAY['DELETED']);
    ELSIF NEW.status IN ({ended}) THEN
        PERFORM pgtasks_resolve(ARRAY[NEW.id], ARRAY[NEW.status::text]);
    ELSE
        PERFORM pgtasks_reopen(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER pgtasks_task_notify_inserted
    AFTER INSERT ON pgtasks_task
    REFERENCING NEW TABLE AS pgtasks_new_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtasks_notify_inserted();
CREATE TRIGGER pgtasks_task_notify_updated
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.status IN ('READY', 'AWAITING_RETRY')
          AND (OLD.status IS DISTINCT FROM NEW.status
               OR OLD.run_after IS DISTINCT FROM NEW.run_after
               OR OLD.queue IS DISTINCT FROM NEW.queue))
    EXECUTE FUNCTION pgtasks_notify_updated();
CREATE TRIGGER pgtasks_task_notify_key_freed
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'RUNNING'
          AND NEW.status <> 'RUNNING')
    EXECUTE FUNCTION pgtasks_notify_key_freed();
CREATE TRIGGER pgtasks_task_notify_cancel
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.cancel_requested AND NOT OLD.cancel_requested AND NEW.status = 'RUNNING')
    EXECUTE FUNCTION pgtasks_notify_cancel();
CREATE TRIGGER pgtasks_task_notify_finished
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.awaited AND NEW.status IN ({ended}) AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION pgtasks_notify_finished();
CREATE TRIGGER pgtasks_task_deleted
    AFTER DELETE ON pgtasks_task
    REFERENCING OLD TABLE AS pgtasks_deleted_tasks
    FOR EACH STATEMENT EXECUTE FUNCTION pgtasks_tasks_deleted();
CREATE TRIGGER pgtasks_task_truncated
    AFTER TRUNCATE ON pgtasks_task
    FOR EACH STATEMENT EXECUTE FUNCTION pgtasks_tasks_truncated();
CREATE TRIGGER pgtasks_task_parent_changed
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.has_dependents
          AND (OLD.status IN ({ended})) <> (NEW.status IN ({ended})))
    EXECUTE FUNCTION pgtasks_parent_changed();
CREATE TRIGGER pgtasks_task_parent_deleted
    AFTER DELETE ON pgtasks_task
    FOR EACH ROW
    WHEN (OLD.has_dependents AND OLD.status NOT IN ({ended}))
    EXECUTE FUNCTION pgtasks_parent_changed();
"""


def reverse(apps, schema_editor):
    connection = schema_editor.connection
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute(_fmt(REVERSE_SQL))
        cursor.execute(_CLAIM_FUNCTION)
        cursor.execute(MEMBER_COMMITTING_0013)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgtasks", "0013_workflows")]

    operations = [migrations.RunPython(forward, reverse, elidable=False)]
