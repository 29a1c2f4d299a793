-- The controlled claim (queue pauses, per-key concurrency and rate limits in the claim itself)
-- and the rate-limit arithmetic over arrays of start times.
--
-- The current definition of each function and trigger of this concern. Migrations apply
-- frozen copies; tests/integration/test_sql.py checks that a migrated database has exactly
-- these. Each definition starts with its `-- name:` line.

-- name: function pgtasks_claim_controlled
CREATE OR REPLACE FUNCTION pgtasks_claim_controlled(p_queues text[], p_limit integer, p_worker text, p_window integer)
 RETURNS SETOF pgtasks_task
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_open text[] := '{}';
    v_rated text[];
    v_rated_keys text[];
    v_full text[];
    v_cand bigint[] := '{}';
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
            SELECT concurrency_key FROM pgtasks_task_live
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
                SELECT t.id FROM pgtasks_task_live t
                WHERE t.status IN ('READY', 'AWAITING_RETRY')
                  AND t.run_after <= statement_timestamp() AND t.queue = q.name
                  AND (t.concurrency_key IS NULL OR t.concurrency_key <> ALL (v_full))
                ORDER BY t.priority DESC, t.run_after, t.id
                LIMIT p_window
                FOR UPDATE OF t SKIP LOCKED) AS c);
    END IF;
    -- 4. The candidates' keys, each locked until commit (in one order: no deadlock), so that
    --    claims of one key take turns; then the rate-limit rows of those keys.
    PERFORM pg_advisory_xact_lock(1885828203, k.h) FROM (
        SELECT DISTINCT hashtext(concurrency_key) AS h FROM pgtasks_task_live
        WHERE id = ANY (v_cand) AND concurrency_key IS NOT NULL ORDER BY 1) AS k;
    v_rated_keys := ARRAY(
        SELECT key FROM pgtasks_key_rate
        WHERE key IN (SELECT concurrency_key FROM pgtasks_task_live WHERE id = ANY (v_cand))
        ORDER BY key FOR UPDATE);
    -- 5. Pick. This statement's snapshot is taken after the locks, so it sees every task
    --    that an earlier claim of the same key started. Per key, the first tasks in claim
    --    order while the key stays within its concurrency limit and rate; per queue, within
    --    its rate; then the best p_limit overall.
    v_picked := ARRAY(
        WITH c AS (
            SELECT id, queue, priority, run_after, concurrency_key,
                   coalesce(concurrency_limit, 1) AS lim
            FROM pgtasks_task_live WHERE id = ANY (v_cand)
        ), running AS (
            SELECT concurrency_key, count(*) AS n FROM pgtasks_task_live
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
        UPDATE pgtasks_task_live t SET status = 'RUNNING', locked_by = p_worker, locked_at = now(),
            claims = t.claims + 1,
            started_at = now(), finished_at = NULL, attempt = t.attempt + 1,
            updated_at = now(), worker_ids = t.worker_ids || jsonb_build_array(p_worker)
        WHERE t.id = ANY (v_picked)
        RETURNING t.*;
    -- 7. Record the starts in the rate windows (rows locked in steps 1 and 4).
    IF cardinality(v_picked) > 0 THEN
        UPDATE pgtasks_queue c
        SET rate_starts = pgtasks_rate_record(c.rate_starts, c.rate_limit, s.n),
            updated_at = now()
        FROM (SELECT queue, count(*)::int AS n FROM pgtasks_task_live WHERE id = ANY (v_picked)
              GROUP BY queue) AS s
        WHERE c.queue = s.queue AND c.queue = ANY (v_rated);
        UPDATE pgtasks_key_rate c
        SET rate_starts = pgtasks_rate_record(c.rate_starts, c.rate_limit, s.n),
            updated_at = now()
        FROM (SELECT concurrency_key AS key, count(*)::int AS n FROM pgtasks_task_live
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
                  AND EXISTS (SELECT 1 FROM pgtasks_task_live t
                              WHERE t.queue = c.queue
                                AND t.status IN ('READY', 'AWAITING_RETRY')
                                AND t.run_after <= statement_timestamp())
                UNION ALL
                SELECT pgtasks_rate_wait(k.rate_starts, k.rate_limit, k.rate_period)
                FROM pgtasks_key_rate k
                WHERE EXISTS (SELECT 1 FROM pgtasks_task_live t
                              WHERE t.concurrency_key = k.key AND t.queue = ANY (v_open)
                                AND t.status IN ('READY', 'AWAITING_RETRY')
                                AND t.run_after <= statement_timestamp())) AS x
                WHERE w > 0);
        END IF;
        PERFORM set_config('pgtasks.retry_in', coalesce(v_wait::text, ''), true);
    END IF;
END
$function$;

-- name: function pgtasks_rate_free
CREATE OR REPLACE FUNCTION pgtasks_rate_free(starts timestamp with time zone[], lim integer, period interval)
 RETURNS integer
 LANGUAGE sql
 STABLE
AS $function$
    SELECT greatest(lim - (SELECT count(*) FROM unnest(starts) AS s WHERE s > now() - period)::int,
                    0)
$function$;

-- name: function pgtasks_rate_record
CREATE OR REPLACE FUNCTION pgtasks_rate_record(starts timestamp with time zone[], lim integer, n integer)
 RETURNS timestamp with time zone[]
 LANGUAGE sql
 STABLE
AS $function$
    SELECT ARRAY(SELECT s FROM (SELECT unnest(starts) UNION ALL
                                SELECT now() FROM generate_series(1, n)) AS x(s)
                 ORDER BY s DESC LIMIT lim)
$function$;

-- name: function pgtasks_rate_wait
CREATE OR REPLACE FUNCTION pgtasks_rate_wait(starts timestamp with time zone[], lim integer, period interval)
 RETURNS double precision
 LANGUAGE sql
 STABLE
AS $function$
    SELECT CASE WHEN pgtasks_rate_free(starts, lim, period) > 0 THEN 0
                ELSE greatest(extract(epoch FROM (
                         SELECT s FROM unnest(starts) AS s ORDER BY s DESC OFFSET lim - 1 LIMIT 1)
                         + period - now()), 0) END
$function$;
