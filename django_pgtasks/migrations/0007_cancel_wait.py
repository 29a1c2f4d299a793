"""Cooperative cancellation of running tasks and waiting for a task to finish.

``cancel_requested``: ``Task.objects...cancel()`` sets it on running tasks. A trigger notifies
the channel ``pgtasks_cancel`` with ``"<task id> <worker id>"`` when it becomes true on a
running task, so the worker holding it learns at once (workers also look for it with each
heartbeat, in case the notification is lost).

``awaited``: ``Task.objects.wait()`` sets it before it sleeps. A trigger notifies the channel
``pgtasks_finished`` with the task's id when an awaited task reaches an end state. Only
awaited tasks notify: the WHEN clause is evaluated per updated row without calling any
function, so claims and completions of tasks nobody waits for pay nothing more than that test
(measured in docs/howto/cancel-snooze-wait.md).
"""

from django.db import migrations, models

SQL = """
CREATE FUNCTION pgtasks_notify_cancel() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgtasks_cancel', NEW.id::text || ' ' || coalesce(NEW.locked_by, ''));
    RETURN NULL;
END
$$;

CREATE FUNCTION pgtasks_notify_finished() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgtasks_finished', NEW.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER pgtasks_task_notify_cancel
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.cancel_requested AND NOT OLD.cancel_requested AND NEW.status = 'RUNNING')
    EXECUTE FUNCTION pgtasks_notify_cancel();

CREATE TRIGGER pgtasks_task_notify_finished
    AFTER UPDATE ON pgtasks_task
    FOR EACH ROW
    WHEN (NEW.awaited AND NEW.status IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')
          AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION pgtasks_notify_finished();
"""

REVERSE_SQL = """
DROP TRIGGER IF EXISTS pgtasks_task_notify_finished ON pgtasks_task;
DROP TRIGGER IF EXISTS pgtasks_task_notify_cancel ON pgtasks_task;
DROP FUNCTION IF EXISTS pgtasks_notify_finished();
DROP FUNCTION IF EXISTS pgtasks_notify_cancel();
"""


def _flag(verbose_name: str, help_text: str) -> models.BooleanField:
    return models.BooleanField(
        db_default=False, default=False, help_text=help_text, verbose_name=verbose_name
    )


CANCEL_HELP = "Cancelled while running: its worker was asked to stop it."
AWAITED_HELP = "Someone waits for this task to finish: its end is announced by NOTIFY."


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0006_controls")]

    operations = [
        migrations.AddField(
            model_name="task",
            name="cancel_requested",
            field=_flag("cancel requested", CANCEL_HELP),
        ),
        migrations.AddField(
            model_name="task",
            name="awaited",
            field=_flag("awaited", AWAITED_HELP),
        ),
        migrations.AddField(
            model_name="archivedtask",
            name="cancel_requested",
            field=_flag("cancel requested", CANCEL_HELP),
        ),
        migrations.AddField(
            model_name="archivedtask",
            name="awaited",
            field=_flag("awaited", AWAITED_HELP),
        ),
        migrations.RunSQL(SQL, REVERSE_SQL),
    ]
