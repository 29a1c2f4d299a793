"""Upgrading an install with a history to the partitioned task table (migration 0014), and
back: every row kept, in its place, with its id, its workflow edges and the id sequence's
position; a migration killed while it moves rows is finished by running it again.

Each test uses a database of its own, migrated to 0013 and filled with SQL.
"""

from __future__ import annotations

import importlib
import signal
import subprocess
from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import ROOT, manage_command
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: Rows per batch of the migration's moves.
BATCH = importlib.import_module("django_pgtasks.migrations.0014_partitioned_history").BATCH
FINISHED = 25_000  # three batches of the migration's 10,000
LIVE = 300

# A history as 0013 kept it: finished rows of every end state, some without finished_at (as
# an old cancel left them), some old; live rows of every live state, some keyed; workflow
# edges from live children to finished parents.
SEED = f"""
INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt, max_attempts,
                          error_text, metadata, finished_at, updated_at, result)
SELECT 'tests.testapp.tasks.noop', 'default', jsonb_build_array(i), '{{}}', 100,
       (ARRAY['SUCCESSFUL', 'FAILED', 'CANCELLED', 'SUCCESSFUL'])[1 + i % 4], 1, 3,
       CASE WHEN i % 4 = 1 THEN 'boom ' || i ELSE '' END, '{{}}',
       CASE WHEN i % 97 = 0 THEN NULL ELSE now() - i * interval '1 minute' END,
       now() - i * interval '1 minute', jsonb_build_object('n', i)
FROM generate_series(1, {FINISHED}) AS i;
INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt, max_attempts,
                          error_text, metadata, key, locked_by, locked_at)
SELECT 'tests.testapp.tasks.noop', 'default', '[]', '{{}}', 100,
       (ARRAY['READY', 'RUNNING', 'WAITING', 'AWAITING_RETRY'])[1 + i % 4],
       CASE WHEN i % 4 = 1 THEN 1 ELSE 0 END, 3, '', '{{}}',
       CASE WHEN i % 10 = 0 THEN 'key-' || i END,
       CASE WHEN i % 4 = 1 THEN 'w-old' END, CASE WHEN i % 4 = 1 THEN now() END
FROM generate_series(1, {LIVE}) AS i;
INSERT INTO pgtasks_dependency (child_id, parent_id, resolved, parent_status)
SELECT c.id, p.id, true, 'SUCCESSFUL'
FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM pgtasks_task
      WHERE status = 'WAITING') AS c
JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM pgtasks_task
      WHERE status = 'SUCCESSFUL') AS p USING (n);
"""

SNAPSHOT = """
SELECT id, status, coalesce(finished_at, updated_at), result, key, error_text
FROM pgtasks_task ORDER BY id
"""


def connect(env: dict[str, str]) -> psycopg.Connection:
    return psycopg.connect(host=env["PGHOST"] or None, port=env["PGPORT"] or None,
                           user=env["PGUSER"] or None, password=env["PGPASSWORD"] or None,
                           dbname=env["PGDATABASE"], autocommit=True)


def migrate(run_in: Callable[..., subprocess.CompletedProcess], env: dict[str, str],
            target: str) -> None:
    result = run_in(env, "migrate", "django_pgtasks", target, timeout=300)
    assert result.returncode == 0, result.stderr


def seeded(run_in, env) -> tuple[list[tuple], list[tuple], int]:
    migrate(run_in, env, "0013")
    with connect(env) as conn:
        conn.execute(SEED)
        rows = conn.execute(SNAPSHOT).fetchall()
        edges = conn.execute("SELECT child_id, parent_id FROM pgtasks_dependency "
                             "ORDER BY 1, 2").fetchall()
        next_id = conn.execute("SELECT last_value FROM pgtasks_task_id_seq").fetchone()[0]
    assert len(rows) == FINISHED + LIVE
    return rows, edges, next_id


def test_the_upgrade_keeps_every_row_in_its_place_and_the_downgrade_brings_them_back(
        empty_database, run_in) -> None:
    env = empty_database
    rows, edges, last_id = seeded(run_in, env)

    migrate(run_in, env, "0014")
    with connect(env) as conn:
        assert conn.execute(SNAPSHOT).fetchall() == rows
        assert conn.execute("SELECT child_id, parent_id FROM pgtasks_dependency "
                            "ORDER BY 1, 2").fetchall() == edges
        places = dict(conn.execute(
            "SELECT tableoid::regclass::text, count(*) FROM pgtasks_task GROUP BY 1"
        ).fetchall())
        # Finished rows are in history, by their end time: the old ones in _before, today's
        # in today's period; live rows in the live partition.
        assert places["pgtasks_task_live"] == LIVE
        assert sum(n for t, n in places.items() if t.startswith("pgtasks_task_done")) == (
            sum(1 for r in rows if r[1] in ("SUCCESSFUL", "CANCELLED")))
        assert sum(n for t, n in places.items() if t.startswith("pgtasks_task_failed")) == (
            sum(1 for r in rows if r[1] == "FAILED"))
        assert places["pgtasks_task_done_before"] > 0
        # The id sequence goes on where it was; a keyed live task keeps its key's uniqueness.
        new_id = conn.execute(
            "INSERT INTO pgtasks_task_live (name, queue, args, kwargs, priority, status, "
            "attempt, max_attempts, error_text, metadata) VALUES ('n', 'default', '[]', "
            "'{}', 100, 'READY', 0, 3, '', '{}') RETURNING id").fetchone()[0]
        assert new_id == last_id + 1
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO pgtasks_task_live (name, queue, args, kwargs, priority, "
                         "status, attempt, max_attempts, error_text, metadata, key) VALUES "
                         "('n', 'default', '[]', '{}', 100, 'READY', 0, 3, '', '{}', 'key-20')")
        conn.execute("DELETE FROM pgtasks_task WHERE id = %s", [new_id])

    # A worker (which needs every migration) drains the upgraded queue: the ready tasks end,
    # in history (and its purge turn deletes the rows of _before older than the retention).
    result = run_in(env, "migrate", "django_pgtasks", timeout=300)
    assert result.returncode == 0, result.stderr
    result = run_in(env, "run_pgtasks", "--burst", timeout=120)
    assert result.returncode == 0, result.stderr
    with connect(env) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pgtasks_task_live WHERE status = 'READY'").fetchone()[0] == 0
        rows = conn.execute(SNAPSHOT).fetchall()
        edges = conn.execute("SELECT child_id, parent_id FROM pgtasks_dependency "
                             "ORDER BY 1, 2").fetchall()

    migrate(run_in, env, "0013")
    with connect(env) as conn:
        assert conn.execute(
            "SELECT relkind FROM pg_class WHERE relname = 'pgtasks_task'").fetchone()[0] == "r"
        assert conn.execute(SNAPSHOT).fetchall() == rows
        assert conn.execute("SELECT child_id, parent_id FROM pgtasks_dependency "
                            "ORDER BY 1, 2").fetchall() == edges
        assert conn.execute(
            "INSERT INTO pgtasks_task (name, queue, args, kwargs, priority, status, attempt, "
            "max_attempts, error_text, metadata) VALUES ('n', 'default', '[]', '{}', 100, "
            "'READY', 0, 3, '', '{}') RETURNING id").fetchone()[0] > last_id + 1
    migrate(run_in, env, "0014")  # and up again


#: The advisory lock the test holds to stop the migration in its last batch.
HELD = 7_014_014

#: A fault, injected: a row trigger on the old table that waits for :data:`HELD` when the row
#: of the last batch's first id is deleted. The migration then stops, deterministically, with
#: its first batches committed and the last one in flight.
STOP_IN_LAST_BATCH = f"""
CREATE FUNCTION test_stop_in_last_batch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({HELD});
    RETURN OLD;
END
$$;
CREATE TRIGGER test_stop_in_last_batch BEFORE DELETE ON pgtasks_task
    FOR EACH ROW WHEN (OLD.id = {2 * BATCH + 1}) EXECUTE FUNCTION test_stop_in_last_batch();
"""


def test_a_migration_killed_while_moving_rows_is_finished_by_running_it_again(
        empty_database, run_in) -> None:
    """The migration is killed (kill -9, its session terminated) between its batches: the
    first two committed, the third in flight, held by an injected trigger, not by timing."""
    env = empty_database
    rows, edges, _last = seeded(run_in, env)
    with connect(env) as holder, connect(env) as conn:
        conn.execute(STOP_IN_LAST_BATCH)
        holder.execute("SELECT pg_advisory_lock(%s)", [HELD])
        process = subprocess.Popen(manage_command("migrate", "django_pgtasks", "0014"),
                                   env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        try:
            waiting: list[int] = []

            def stopped() -> bool:
                waiting[:] = [pid for (pid,) in conn.execute(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
                    "AND NOT granted AND database = (SELECT oid FROM pg_database "
                    "WHERE datname = current_database())", [HELD])]
                return bool(waiting)
            wait_until(stopped, what="the migration to reach its last batch")
            [pid] = waiting
            moved = conn.execute("SELECT (SELECT count(*) FROM pgtasks_task_done) + "
                                 "(SELECT count(*) FROM pgtasks_task_failed)").fetchone()[0]
            assert moved == 2 * BATCH  # two batches committed, the third not
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        finally:
            if process.poll() is None:
                process.kill()
        holder.execute("SELECT pg_advisory_unlock(%s)", [HELD])
        wait_until(lambda: not conn.execute("SELECT EXISTS (SELECT FROM pg_stat_activity "
                                            "WHERE pid = %s)", [pid]).fetchone()[0],
                   what="the migration's session to end")
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'pgtasks_task'"
                            ).fetchone()[0] == "r"  # the swap never ran
        assert conn.execute("SELECT count(*) FROM pgtasks_task").fetchone()[0] == (
            len(rows) - 2 * BATCH)  # the third batch rolled back: its rows are still here
        conn.execute("DROP TRIGGER test_stop_in_last_batch ON pgtasks_task; "
                     "DROP FUNCTION test_stop_in_last_batch()")
    migrate(run_in, env, "0014")
    with connect(env) as conn:
        assert conn.execute(SNAPSHOT).fetchall() == rows
        assert conn.execute("SELECT child_id, parent_id FROM pgtasks_dependency "
                            "ORDER BY 1, 2").fetchall() == edges
