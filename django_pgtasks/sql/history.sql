-- Partitioned history: a row entering history (its end) or coming back (an operator's retry), an
-- end written without finished_at, and the workflow rows that go with deleted tasks.
--
-- The current definition of each function and trigger of this concern. Migrations apply
-- frozen copies; tests/integration/test_sql.py checks that a migrated database has exactly
-- these. Each definition starts with its `-- name:` line.

-- name: function pgtasks_task_entered_history
CREATE OR REPLACE FUNCTION pgtasks_task_entered_history()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
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
$function$;

-- name: function pgtasks_task_left_history
CREATE OR REPLACE FUNCTION pgtasks_task_left_history()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF NEW.status IN ('READY', 'AWAITING_RETRY') THEN
        PERFORM pgtasks_notify_updated_row(NEW.queue, NEW.run_after);
    END IF;
    IF NEW.has_dependents THEN
        PERFORM pgtasks_reopen(ARRAY[NEW.id]);
    END IF;
    RETURN NULL;
END
$function$;

-- name: function pgtasks_task_ending
CREATE OR REPLACE FUNCTION pgtasks_task_ending()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    NEW.finished_at := statement_timestamp();
    RETURN NEW;
END
$function$;

-- name: function pgtasks_tasks_deleted
CREATE OR REPLACE FUNCTION pgtasks_tasks_deleted()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF current_setting('pgtasks.moving_history', true) = 'on' THEN
        RETURN NULL;
    END IF;
    DELETE FROM pgtasks_dependency d USING pgtasks_deleted_tasks g WHERE d.child_id = g.id;
    DELETE FROM pgtasks_workflow_member m USING pgtasks_deleted_tasks g WHERE m.task_id = g.id;
    RETURN NULL;
END
$function$;

-- name: function pgtasks_tasks_truncated
CREATE OR REPLACE FUNCTION pgtasks_tasks_truncated()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
BEGIN
    -- DELETE, not TRUNCATE: a TRUNCATE naming these tables too (Django's flush) is running.
    DELETE FROM pgtasks_dependency;
    DELETE FROM pgtasks_workflow_member;
    RETURN NULL;
END
$function$;

-- name: trigger pgtasks_task_done_entered on pgtasks_task_done
CREATE TRIGGER pgtasks_task_done_entered AFTER INSERT ON pgtasks_task_done
    FOR EACH ROW
    WHEN (NEW.awaited OR NEW.has_dependents OR NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION pgtasks_task_entered_history();

-- name: trigger pgtasks_task_failed_entered on pgtasks_task_failed
CREATE TRIGGER pgtasks_task_failed_entered AFTER INSERT ON pgtasks_task_failed
    FOR EACH ROW
    WHEN (NEW.awaited OR NEW.has_dependents OR NEW.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION pgtasks_task_entered_history();

-- name: trigger pgtasks_task_live_returned on pgtasks_task_live
CREATE TRIGGER pgtasks_task_live_returned AFTER INSERT ON pgtasks_task_live
    FOR EACH ROW
    WHEN (NEW.finished_at IS NOT NULL)
    EXECUTE FUNCTION pgtasks_task_left_history();

-- name: trigger pgtasks_task_ending on pgtasks_task_live
CREATE TRIGGER pgtasks_task_ending BEFORE UPDATE ON pgtasks_task_live
    FOR EACH ROW
    WHEN (NEW.finished_at IS NULL AND NEW.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED'))
    EXECUTE FUNCTION pgtasks_task_ending();

-- name: trigger pgtasks_task_deleted on pgtasks_task
CREATE TRIGGER pgtasks_task_deleted AFTER DELETE ON pgtasks_task
    REFERENCING OLD TABLE AS pgtasks_deleted_tasks
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgtasks_tasks_deleted();

-- name: trigger pgtasks_task_truncated on pgtasks_task
CREATE TRIGGER pgtasks_task_truncated AFTER TRUNCATE ON pgtasks_task
    FOR EACH STATEMENT
    EXECUTE FUNCTION pgtasks_tasks_truncated();
