-- Wake-ups: NOTIFY on the channels the workers LISTEN on (pgtasks: new or due work,
-- pgtasks_cancel: a running task asked to stop, pgtasks_finished: an awaited task ended).
--
-- The current definition of each function and trigger of this concern. Migrations apply
-- frozen copies; tests/integration/test_sql.py checks that a migrated database has exactly
-- these. Each definition starts with its `-- name:` line.

-- name: function pgtasks_notify_inserted
CREATE OR REPLACE FUNCTION pgtasks_notify_inserted()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
DECLARE
    q record;
BEGIN
    FOR q IN
        SELECT queue,
               bool_or(run_after <= statement_timestamp()) AS due_now,
               min(run_after) FILTER (WHERE run_after > statement_timestamp()) AS first_later
        FROM pgtasks_new_tasks
        WHERE status IN ('READY', 'AWAITING_RETRY')
        GROUP BY queue
    LOOP
        IF q.due_now THEN
            PERFORM pg_notify('pgtasks', q.queue);
        END IF;
        IF q.first_later IS NOT NULL THEN
            PERFORM pg_notify('pgtasks', q.queue || '@'
                              || extract(epoch FROM q.first_later - statement_timestamp())::text);
        END IF;
    END LOOP;
    RETURN NULL;
END
$function$;

-- name: function pgtasks_notify_updated
CREATE OR REPLACE FUNCTION pgtasks_notify_updated()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NEW.run_after <= statement_timestamp() THEN
        PERFORM pg_notify('pgtasks', NEW.queue);
    ELSE
        PERFORM pg_notify('pgtasks', NEW.queue || '@'
                          || extract(epoch FROM NEW.run_after - statement_timestamp())::text);
    END IF;
    RETURN NULL;
END
$function$;

-- name: function pgtasks_notify_updated_row
CREATE OR REPLACE FUNCTION pgtasks_notify_updated_row(p_queue text, p_run_after timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF p_run_after <= statement_timestamp() THEN
        PERFORM pg_notify('pgtasks', p_queue);
    ELSE
        PERFORM pg_notify('pgtasks', p_queue || '@'
                          || extract(epoch FROM p_run_after - statement_timestamp())::text);
    END IF;
END
$function$;

-- name: function pgtasks_notify_key_freed
CREATE OR REPLACE FUNCTION pgtasks_notify_key_freed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_notify('pgtasks', OLD.queue);
    RETURN NULL;
END
$function$;

-- name: function pgtasks_notify_cancel
CREATE OR REPLACE FUNCTION pgtasks_notify_cancel()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_notify('pgtasks_cancel', NEW.id::text || ' ' || coalesce(NEW.locked_by, ''));
    RETURN NULL;
END
$function$;

-- name: function pgtasks_notify_finished
CREATE OR REPLACE FUNCTION pgtasks_notify_finished()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    PERFORM pg_notify('pgtasks_finished', NEW.id::text);
    RETURN NULL;
END
$function$;

-- name: trigger pgtasks_task_notify_inserted on pgtasks_task
CREATE TRIGGER pgtasks_task_notify_inserted AFTER INSERT ON pgtasks_task
    REFERENCING NEW TABLE AS pgtasks_new_tasks
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgtasks_notify_inserted();

-- name: trigger pgtasks_task_live_notify_inserted on pgtasks_task_live
CREATE TRIGGER pgtasks_task_live_notify_inserted AFTER INSERT ON pgtasks_task_live
    REFERENCING NEW TABLE AS pgtasks_new_tasks
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgtasks_notify_inserted();

-- name: trigger pgtasks_task_notify_updated on pgtasks_task
CREATE TRIGGER pgtasks_task_notify_updated AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.status IN ('READY', 'AWAITING_RETRY')
          AND (OLD.status IS DISTINCT FROM NEW.status
               OR OLD.run_after IS DISTINCT FROM NEW.run_after
               OR OLD.queue IS DISTINCT FROM NEW.queue))
    EXECUTE FUNCTION pgtasks_notify_updated();

-- name: trigger pgtasks_task_notify_key_freed on pgtasks_task
CREATE TRIGGER pgtasks_task_notify_key_freed AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'RUNNING'
          AND NEW.status <> 'RUNNING')
    EXECUTE FUNCTION pgtasks_notify_key_freed();

-- name: trigger pgtasks_task_notify_cancel on pgtasks_task
CREATE TRIGGER pgtasks_task_notify_cancel AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.cancel_requested AND NOT OLD.cancel_requested AND NEW.status = 'RUNNING')
    EXECUTE FUNCTION pgtasks_notify_cancel();

-- name: trigger pgtasks_task_notify_finished on pgtasks_task
CREATE TRIGGER pgtasks_task_notify_finished AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.awaited AND NEW.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION pgtasks_notify_finished();
