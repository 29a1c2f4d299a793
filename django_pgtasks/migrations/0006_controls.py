"""Queue controls: per-key concurrency, rate limits, pause/resume.

- ``Task.concurrency_key`` / ``concurrency_limit``: at most ``concurrency_limit`` tasks of one
  key run at a time, across all workers; two partial indexes, empty unless keys are used.
- ``pgtasks_queue``: one row per paused or rate-limited queue; ``pgtasks_key_rate``: rate
  limits of concurrency keys. Both keep the start times of their latest ``rate_limit`` tasks.
- ``pgtasks_claim_controlled()``: the claim used when keys or rate limits are in play (see
  ``django_pgtasks/claiming.py`` for the reasoning); ``pgtasks_rate_*()`` its helpers.
- A trigger wakes the workers of a queue when a task with a concurrency key stops running,
  since that may let a waiting task of its key start.
"""

import datetime

import django.db.models.functions.datetime
from django.db import migrations, models

#: First key of the transaction-level advisory locks on concurrency keys ("pgtk"); the
#: second is hashtext(key). Must equal django_pgtasks.claiming.KEY_LOCK_NAMESPACE.
KEY_LOCK_NAMESPACE = 0x7067746B

SQL = f"""
-- The record of recent starts is empty for a new row (raw INSERTs such as pause() omit it).
ALTER TABLE pgtasks_queue ALTER COLUMN rate_starts SET DEFAULT '{{}}';
ALTER TABLE pgtasks_key_rate ALTER COLUMN rate_starts SET DEFAULT '{{}}';

-- Starts still allowed now in a sliding window that holds the latest starts.
CREATE FUNCTION pgtasks_rate_free(starts timestamptz[], lim integer, period interval)
RETURNS integer LANGUAGE sql STABLE AS $$
    SELECT greatest(lim - (SELECT count(*) FROM unnest(starts) AS s WHERE s > now() - period)::int,
                    0)
$$;

-- The window after n more starts now: the latest lim start times. (Older ones are never
-- needed: a claim counts the starts later than its own now() - period, and if lim of them
-- are later, it may start nothing anyway. Dropping starts by age instead would be wrong: a
-- claim that waited for the row's lock records an earlier now() than the claims before it.)
CREATE FUNCTION pgtasks_rate_record(starts timestamptz[], lim integer, n integer)
RETURNS timestamptz[] LANGUAGE sql STABLE AS $$
    SELECT ARRAY(SELECT s FROM (SELECT unnest(starts) UNION ALL
                                SELECT now() FROM generate_series(1, n)) AS x(s)
                 ORDER BY s DESC LIMIT lim)
$$;

-- Seconds until the window allows a start again (0 if it allows one now).
CREATE FUNCTION pgtasks_rate_wait(starts timestamptz[], lim integer, period interval)
RETURNS double precision LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN pgtasks_rate_free(starts, lim, period) > 0 THEN 0
                ELSE greatest(extract(epoch FROM (
                         SELECT s FROM unnest(starts) AS s ORDER BY s DESC OFFSET lim - 1 LIMIT 1)
                         + period - now()), 0) END
$$;

CREATE FUNCTION pgtasks_claim_controlled(p_queues text[], p_limit integer, p_worker text,
                                         p_window integer)
RETURNS SETOF pgtasks_task LANGUAGE plpgsql AS $$
DECLARE
    v_open text[] := '{{}}';
    v_rated text[];
    v_rated_keys text[];
    v_full text[];
    v_cand bigint[] := '{{}}';
    v_picked bigint[];
    v_wait double precision;
BEGIN
    PERFORM set_config('pgtasks.retry_in', '', true);
    -- 1. Rate-limited queues: lock their rows (in name order), so that claims of one such
    --    queue take turns; keep the queues that are not paused and have a start left. Only
    --    the rows locked here are read for rates and written in step 7.
    v_rated := ARRAY(
        SELECT queue FROM pgtasks_queue
        WHERE queue = ANY (p_queues) AND rate_limit IS NOT NULL AND NOT paused
        ORDER BY queue FOR UPDATE);
    v_open := ARRAY(
        SELECT q FROM unnest(p_queues) AS q
        WHERE NOT EXISTS (
            SELECT 1 FROM pgtasks_queue c
            WHERE c.queue = q AND (c.paused OR (c.queue = ANY (v_rated) AND
                  pgtasks_rate_free(c.rate_starts, c.rate_limit, c.rate_period) = 0))));
    IF cardinality(v_open) > 0 THEN
        -- 2. Keys that cannot start a task now (as many running as their limit, or no start
        --    left in their rate window). Read before the key locks: only a hint that spares
        --    the scan below their waiting tasks; step 5 decides.
        v_full := ARRAY(
            SELECT concurrency_key FROM pgtasks_task
            WHERE status = 'RUNNING' AND concurrency_key IS NOT NULL
            GROUP BY concurrency_key
            HAVING count(*) >= min(coalesce(concurrency_limit, 1))
            UNION
            SELECT key FROM pgtasks_key_rate
            WHERE pgtasks_rate_free(rate_starts, rate_limit, rate_period) = 0);
        -- 3. Candidates: per queue, the first due tasks in claim order (the claim index),
        --    locked, skipping rows other claimers hold.
        v_cand := ARRAY(
            SELECT c.id FROM unnest(v_open) AS q(name) CROSS JOIN LATERAL (
                SELECT t.id FROM pgtasks_task t
                WHERE t.status IN ('READY', 'AWAITING_RETRY')
                  AND t.run_after <= statement_timestamp() AND t.queue = q.name
                  AND (t.concurrency_key IS NULL OR t.concurrency_key <> ALL (v_full))
                ORDER BY t.priority DESC, t.run_after, t.id
                LIMIT p_window
                FOR UPDATE OF t SKIP LOCKED) AS c);
    END IF;
    -- 4. The candidates' keys, each locked until commit (in one order: no deadlock), so that
    --    claims of one key take turns; then the rate-limit rows of those keys.
    PERFORM pg_advisory_xact_lock({KEY_LOCK_NAMESPACE}, k.h) FROM (
        SELECT DISTINCT hashtext(concurrency_key) AS h FROM pgtasks_task
        WHERE id = ANY (v_cand) AND concurrency_key IS NOT NULL ORDER BY 1) AS k;
    v_rated_keys := ARRAY(
        SELECT key FROM pgtasks_key_rate
        WHERE key IN (SELECT concurrency_key FROM pgtasks_task WHERE id = ANY (v_cand))
        ORDER BY key FOR UPDATE);
    -- 5. Pick. This statement's snapshot is taken after the locks, so it sees every task
    --    that an earlier claim of the same key started. Per key, the first tasks in claim
    --    order while the key stays within its concurrency limit and rate; per queue, within
    --    its rate; then the best p_limit overall.
    v_picked := ARRAY(
        WITH c AS (
            SELECT id, queue, priority, run_after, concurrency_key,
                   coalesce(concurrency_limit, 1) AS lim
            FROM pgtasks_task WHERE id = ANY (v_cand)
        ), running AS (
            SELECT concurrency_key, count(*) AS n FROM pgtasks_task
            WHERE status = 'RUNNING' AND concurrency_key IN (SELECT concurrency_key FROM c)
            GROUP BY concurrency_key
        ), key_rate AS (
            SELECT key, pgtasks_rate_free(rate_starts, rate_limit, rate_period) AS free
            FROM pgtasks_key_rate WHERE key = ANY (v_rated_keys)
        ), by_key AS (
            SELECT c.*, row_number() OVER (PARTITION BY c.concurrency_key
                                           ORDER BY c.priority DESC, c.run_after, c.id) AS rk
            FROM c
        ), key_ok AS (
            SELECT b.* FROM by_key b
            LEFT JOIN running r ON r.concurrency_key = b.concurrency_key
            LEFT JOIN key_rate kr ON kr.key = b.concurrency_key
            WHERE b.concurrency_key IS NULL
               OR (b.rk + coalesce(r.n, 0) <= b.lim AND b.rk <= coalesce(kr.free, b.rk))
        ), by_queue AS (
            SELECT k.*, row_number() OVER (PARTITION BY k.queue
                                           ORDER BY k.priority DESC, k.run_after, k.id) AS rq
            FROM key_ok k
        ), queue_rate AS (
            SELECT queue, pgtasks_rate_free(rate_starts, rate_limit, rate_period) AS free
            FROM pgtasks_queue WHERE queue = ANY (v_rated)
        )
        SELECT b.id FROM by_queue b LEFT JOIN queue_rate qr ON qr.queue = b.queue
        WHERE b.rq <= coalesce(qr.free, b.rq)
        ORDER BY b.priority DESC, b.run_after, b.id
        LIMIT p_limit);
    -- 6. Start them (the same changes as the plain claim).
    RETURN QUERY
        UPDATE pgtasks_task t SET status = 'RUNNING', locked_by = p_worker, locked_at = now(),
            started_at = now(), finished_at = NULL, attempt = t.attempt + 1,
            updated_at = now(), worker_ids = t.worker_ids || jsonb_build_array(p_worker)
        WHERE t.id = ANY (v_picked)
        RETURNING t.*;
    -- 7. Record the starts in the rate windows (rows locked in steps 1 and 4).
    IF cardinality(v_picked) > 0 THEN
        UPDATE pgtasks_queue c
        SET rate_starts = pgtasks_rate_record(c.rate_starts, c.rate_limit, s.n),
            updated_at = now()
        FROM (SELECT queue, count(*)::int AS n FROM pgtasks_task WHERE id = ANY (v_picked)
              GROUP BY queue) AS s
        WHERE c.queue = s.queue AND c.queue = ANY (v_rated);
        UPDATE pgtasks_key_rate c
        SET rate_starts = pgtasks_rate_record(c.rate_starts, c.rate_limit, s.n),
            updated_at = now()
        FROM (SELECT concurrency_key AS key, count(*)::int AS n FROM pgtasks_task
              WHERE id = ANY (v_picked) AND concurrency_key IS NOT NULL
              GROUP BY concurrency_key) AS s
        WHERE c.key = s.key AND c.key = ANY (v_rated_keys);
    END IF;
    -- 8. Fewer than asked: tell the worker when to look again. 0 when a window of candidates
    --    was cut short by key limits (tasks of other keys may wait behind it); else the
    --    seconds until a rate limit that holds due tasks back allows a start again.
    IF cardinality(v_picked) < p_limit THEN
        IF cardinality(v_picked) > 0 AND cardinality(v_cand) >= p_window THEN
            v_wait := 0;
        ELSE
            v_wait := (SELECT min(w) FROM (
                SELECT pgtasks_rate_wait(c.rate_starts, c.rate_limit, c.rate_period) AS w
                FROM pgtasks_queue c
                WHERE c.queue = ANY (p_queues) AND c.rate_limit IS NOT NULL AND NOT c.paused
                  AND EXISTS (SELECT 1 FROM pgtasks_task t
                              WHERE t.queue = c.queue
                                AND t.status IN ('READY', 'AWAITING_RETRY')
                                AND t.run_after <= statement_timestamp())
                UNION ALL
                SELECT pgtasks_rate_wait(k.rate_starts, k.rate_limit, k.rate_period)
                FROM pgtasks_key_rate k
                WHERE EXISTS (SELECT 1 FROM pgtasks_task t
                              WHERE t.concurrency_key = k.key AND t.queue = ANY (v_open)
                                AND t.status IN ('READY', 'AWAITING_RETRY')
                                AND t.run_after <= statement_timestamp())) AS x
                WHERE w > 0);
        END IF;
        PERFORM set_config('pgtasks.retry_in', coalesce(v_wait::text, ''), true);
    END IF;
END
$$;

-- A task with a concurrency key that stops running may let a waiting task of its key start:
-- wake the workers of its queue. Only keyed tasks reach the function (the WHEN clause).
CREATE FUNCTION pgtasks_notify_key_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgtasks', OLD.queue);
    RETURN NULL;
END
$$;

CREATE TRIGGER pgtasks_task_notify_key_freed
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'RUNNING'
          AND NEW.status <> 'RUNNING')
    EXECUTE FUNCTION pgtasks_notify_key_freed();
"""

REVERSE_SQL = """
DROP TRIGGER IF EXISTS pgtasks_task_notify_key_freed ON pgtasks_task;
DROP FUNCTION IF EXISTS pgtasks_notify_key_freed();
DROP FUNCTION IF EXISTS pgtasks_claim_controlled(text[], integer, text, integer);
DROP FUNCTION IF EXISTS pgtasks_rate_wait(timestamptz[], integer, interval);
DROP FUNCTION IF EXISTS pgtasks_rate_record(timestamptz[], integer, integer);
DROP FUNCTION IF EXISTS pgtasks_rate_free(timestamptz[], integer, interval);
"""


class TimestampArrayField(models.Field):
    """A ``timestamptz[]`` column, frozen here as this migration created it (the project's
    field now lives in ``django_pgtasks.models.fields``; migration 0010 points the columns
    there)."""

    def db_type(self, connection):
        return "timestamp with time zone[]"

    def get_db_prep_value(self, value, connection, prepared=False):
        return None if value is None else list(value)

    def from_db_value(self, value, expression, connection):
        return value


_STARTS = TimestampArrayField(
    blank=True,
    default=list,
    editable=False,
    help_text="Start times of the latest tasks, kept by the claim for the rate limit.",
    verbose_name="recent starts",
)


def _concurrency_key() -> models.CharField:
    return models.CharField(
        blank=True,
        default=None,
        help_text="Tasks sharing this key run at most concurrency_limit at a time.",
        max_length=255,
        null=True,
        verbose_name="concurrency key",
    )


def _concurrency_limit() -> models.PositiveSmallIntegerField:
    return models.PositiveSmallIntegerField(
        blank=True,
        default=None,
        help_text="Most tasks of the concurrency key that may run at once (with the key).",
        null=True,
        verbose_name="concurrency limit",
    )


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0005_archive_schedules_keys")]

    operations = [
        migrations.CreateModel(
            name="KeyRateLimit",
            fields=[
                (
                    "key",
                    models.CharField(
                        max_length=255,
                        primary_key=True,
                        serialize=False,
                        verbose_name="concurrency key",
                    ),
                ),
                (
                    "rate_limit",
                    models.PositiveIntegerField(
                        help_text="At most this many tasks of the key start per period.",
                        verbose_name="rate limit",
                    ),
                ),
                ("rate_period", models.DurationField(verbose_name="rate period")),
                ("rate_starts", _STARTS.clone()),
                (
                    "updated_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="updated",
                    ),
                ),
            ],
            options={
                "verbose_name": "key rate limit",
                "verbose_name_plural": "key rate limits",
                "db_table": "pgtasks_key_rate",
                "ordering": ["key"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            ("rate_limit__gte", 1),
                            ("rate_limit__lte", 10000),
                            ("rate_period__gt", datetime.timedelta(0)),
                        ),
                        name="pgtasks_key_rate_valid",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="QueueControl",
            fields=[
                (
                    "queue",
                    models.CharField(
                        max_length=100, primary_key=True, serialize=False, verbose_name="queue"
                    ),
                ),
                (
                    "paused",
                    models.BooleanField(
                        db_default=False,
                        default=False,
                        help_text="Workers start no task of a paused queue; running tasks finish.",
                        verbose_name="paused",
                    ),
                ),
                (
                    "paused_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="paused since"),
                ),
                (
                    "rate_limit",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="At most this many tasks of the queue start per rate period.",
                        null=True,
                        verbose_name="rate limit",
                    ),
                ),
                (
                    "rate_period",
                    models.DurationField(blank=True, null=True, verbose_name="rate period"),
                ),
                ("rate_starts", _STARTS.clone()),
                (
                    "updated_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="updated",
                    ),
                ),
            ],
            options={
                "verbose_name": "queue",
                "verbose_name_plural": "queues",
                "db_table": "pgtasks_queue",
                "ordering": ["queue"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("rate_limit__isnull", True), ("rate_period__isnull", True)),
                            models.Q(
                                ("rate_limit__gte", 1),
                                ("rate_limit__lte", 10000),
                                ("rate_period__gt", datetime.timedelta(0)),
                            ),
                            _connector="OR",
                        ),
                        name="pgtasks_queue_rate_valid",
                    ),
                ],
            },
        ),
        migrations.AddField(
            model_name="archivedtask", name="concurrency_key", field=_concurrency_key()
        ),
        migrations.AddField(
            model_name="archivedtask", name="concurrency_limit", field=_concurrency_limit()
        ),
        migrations.AddField(model_name="task", name="concurrency_key", field=_concurrency_key()),
        migrations.AddField(
            model_name="task", name="concurrency_limit", field=_concurrency_limit()
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("concurrency_key__isnull", False), ("status", "RUNNING")),
                fields=["concurrency_key"],
                name="pgtasks_task_key_running_idx",
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(
                    ("concurrency_key__isnull", False),
                    ("status__in", ("READY", "AWAITING_RETRY")),
                ),
                fields=["queue", "concurrency_key"],
                name="pgtasks_task_key_pending_idx",
            ),
        ),
        migrations.RunSQL(SQL, REVERSE_SQL),
    ]
