from django.db import migrations

# Wake-ups: workers LISTEN on the channel "pgtasks". A task that becomes claimable notifies it
# with the task's queue as the payload; a task that becomes pending for later notifies
# "<queue>@<seconds from now>", so a sleeping worker can set a timer without comparing its
# clock with the database's. NOTIFY is delivered at commit, so a worker never wakes for a task
# it cannot see yet, and PostgreSQL folds identical notifications of one transaction into one.
#
# INSERT: one statement-level trigger per INSERT statement (bulk inserts notify once per queue).
# UPDATE: a row-level trigger whose WHEN clause lets only rows that *become* pending through
# (retries, operator actions, rescue) reach the function, so claims and completions, which
# never produce pending rows, pay nothing.
#
# "Now" is statement_timestamp(), the clock Django's Now() (and so run_after's default and the
# claim) uses, so a task enqueued late in a long transaction still counts as due.
SQL = """
CREATE FUNCTION pgtasks_notify_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
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
$$;

CREATE FUNCTION pgtasks_notify_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.run_after <= statement_timestamp() THEN
        PERFORM pg_notify('pgtasks', NEW.queue);
    ELSE
        PERFORM pg_notify('pgtasks', NEW.queue || '@'
                          || extract(epoch FROM NEW.run_after - statement_timestamp())::text);
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
"""

REVERSE_SQL = """
DROP TRIGGER IF EXISTS pgtasks_task_notify_updated ON pgtasks_task;
DROP TRIGGER IF EXISTS pgtasks_task_notify_inserted ON pgtasks_task;
DROP FUNCTION IF EXISTS pgtasks_notify_updated();
DROP FUNCTION IF EXISTS pgtasks_notify_inserted();
"""


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0003_attempt_history")]

    operations = [migrations.RunSQL(SQL, REVERSE_SQL)]
