-- Enqueue: the INSERT of Task.objects.enqueue() as a function, whose plan the session keeps (no
-- server-side prepare: poolers).
--
-- The current definition of each function and trigger of this concern. Migrations apply
-- frozen copies; tests/integration/test_sql.py checks that a migrated database has exactly
-- these. Each definition starts with its `-- name:` line.

-- name: function pgtasks_enqueue_one
CREATE OR REPLACE FUNCTION pgtasks_enqueue_one(p_name text, p_queue text, p_args jsonb, p_kwargs jsonb, p_priority smallint, p_max_attempts integer, p_run_after timestamp with time zone, p_delay double precision, p_metadata jsonb, p_stage text, p_concurrency_key text, p_concurrency_limit smallint, OUT id bigint, OUT run_after timestamp with time zone, OUT created_at timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO pgtasks_task_live AS t (
        name, queue, args, kwargs, priority, max_attempts, run_after, metadata, stage,
        concurrency_key, concurrency_limit, status, attempt, error_text)
    VALUES (
        p_name, p_queue, p_args, p_kwargs, p_priority, p_max_attempts,
        COALESCE(p_run_after, statement_timestamp() + make_interval(secs => p_delay),
                 statement_timestamp()),
        p_metadata, p_stage, p_concurrency_key, p_concurrency_limit, 'READY', 0, '')
    RETURNING t.id, t.run_after, t.created_at INTO id, run_after, created_at;
END
$function$;
