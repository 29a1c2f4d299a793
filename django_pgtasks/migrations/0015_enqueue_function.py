"""The INSERT of ``Task.objects.enqueue()`` as a PL/pgSQL function, for speed.

Django's connections prepare nothing on the server (a pooler in transaction mode could hand
the next statement to a session where the prepared statement does not exist), so every
enqueue had its INSERT parsed, analysed and planned afresh (docs/performance.md gives the
figures). A PL/pgSQL function keeps the plan of its statements for the rest of the session
by itself, whichever session a pooler gives the call to; the call is a trivial ``SELECT`` to
plan.

``pgtasks_enqueue_one`` inserts one task without a key into the live partition and returns
its id, ``run_after`` and ``created_at``. ``run_after`` is the given time, else the delay in
seconds from the statement's time, else that time itself (the database clock, as before).
"""

from django.db import migrations

CREATE = """
CREATE FUNCTION pgtasks_enqueue_one(
    p_name text, p_queue text, p_args jsonb, p_kwargs jsonb, p_priority smallint,
    p_max_attempts integer, p_run_after timestamptz, p_delay double precision,
    p_metadata jsonb, p_stage text, p_concurrency_key text, p_concurrency_limit smallint,
    OUT id bigint, OUT run_after timestamptz, OUT created_at timestamptz)
LANGUAGE plpgsql AS $$
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
$$;
"""

DROP = "DROP FUNCTION pgtasks_enqueue_one"


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0014_partitioned_history")]

    operations = [migrations.RunSQL(CREATE, DROP, elidable=False)]
