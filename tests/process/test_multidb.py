"""Queues spread over two PostgreSQL servers (docs/scaling.md).

``default`` is the suite's usual server; ``second`` is another server started for the test
run (tests/second_server.py). The queues ``reports`` and ``exports`` live on ``second``
(tests/settings_multidb.py), the others on ``default``. Each test proves one path against
both real servers: enqueue, claim, the worker processes, rescue, purge, the system checks,
periodic tasks, the django.tasks backend, the admin, and one database going away while the
other keeps working.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db import connections, transaction
from django.urls import reverse

from django_pgtasks.checks import check_queue_databases, check_queue_tables, check_settings
from django_pgtasks.definition.routing import database_for_queue, queue_databases, queues_on
from django_pgtasks.models import Status, Task
from django_pgtasks.scheduling import run_scheduler
from django_pgtasks.worker.executor import _enqueue_followups
from django_pgtasks.worker.liveness import rescue
from django_pgtasks.worker.loop import Worker
from tests.conftest import ROOT, manage_command, started_processes
from tests.helpers import wait_until
from tests.settings_multidb import MULTIDB_QUEUES, SECOND
from tests.testapp import tasks

if SECOND not in django_settings.DATABASES:  # pragma: no cover - CI always has it
    if os.environ.get("CI"):
        raise RuntimeError("CI must run the multi-database tests: no second PostgreSQL server "
                           "could be started (see tests/second_server.py).")
    pytest.skip("no second PostgreSQL server (see tests/second_server.py)",
                allow_module_level=True)

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", SECOND])


@pytest.fixture(autouse=True)
def multidb(settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "QUEUES": MULTIDB_QUEUES}


@pytest.fixture
def env(subprocess_env: dict[str, str]) -> dict[str, str]:
    """Environment of a child process that runs with the two-database settings."""
    return {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.settings_multidb"}


@pytest.fixture
def start(env: dict[str, str]) -> Iterator[Callable[..., subprocess.Popen]]:
    """Start a command with the two-database settings; killed with its workers at the end."""
    with started_processes(env) as start:
        yield start


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(manage_command(*args), env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def on(alias: str) -> Any:
    return Task.objects.using(alias)


def server_identity(alias: str) -> tuple[int, str]:
    """The cluster's system identifier and version: distinct per PostgreSQL server."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT system_identifier FROM pg_control_system()")
        identifier = cursor.fetchone()[0]
        cursor.execute("SHOW server_version")
        return identifier, cursor.fetchone()[0]


# -- two servers, routing ------------------------------------------------------------------


def test_the_two_aliases_are_two_servers() -> None:
    assert server_identity("default")[0] != server_identity(SECOND)[0]


def test_routing_maps_queues_to_databases() -> None:
    assert database_for_queue("emails") == "default"
    assert database_for_queue("reports") == SECOND
    assert database_for_queue("not-configured") == "default"
    assert queue_databases() == ["default", SECOND]
    assert queues_on(SECOND) == ["reports", "exports"]
    assert queues_on("default") == ["default", "emails", "urgent"]


def test_migrate_created_the_task_tables_on_both_servers() -> None:
    # The test databases were made with ``migrate`` on each alias.
    assert check_queue_tables(databases=["default", SECOND]) == []
    result = call_command_output("showmigrations", "django_pgtasks", "--database", SECOND)
    assert "[ ]" not in result
    assert "[X] 0001_initial" in result


def call_command_output(*args: str) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


# -- enqueue ----------------------------------------------------------------------------------


def test_enqueue_writes_to_the_database_of_the_queue() -> None:
    report = tasks.add.enqueue(1, 2, queue="reports")
    email = Task.objects.enqueue(tasks.add, 3, 4, queue="emails")
    assert (report._state.db, email._state.db) == (SECOND, "default")
    assert list(on(SECOND).values_list("queue", "args")) == [("reports", [1, 2])]
    assert list(on("default").values_list("queue", "args")) == [("emails", [3, 4])]


def test_an_explicit_using_still_wins() -> None:
    task = Task.objects.enqueue(tasks.noop, queue="reports", using="default")
    assert on("default").filter(pk=task.pk, queue="reports").exists()
    assert not on(SECOND).exists()
    Task.objects.db_manager(SECOND).enqueue(tasks.noop, queue="emails")
    assert on(SECOND).filter(queue="emails").count() == 1


def test_enqueue_many_splits_the_batch_by_database() -> None:
    built = [tasks.add.build(i, i, queue=q) for i, q in
             enumerate(["emails", "reports", "default", "exports", "reports"])]
    saved = Task.objects.enqueue_many(built)
    assert [t._state.db for t in saved] == ["default", SECOND, "default", SECOND, SECOND]
    assert sorted(on(SECOND).values_list("args", flat=True)) == [[1, 1], [3, 3], [4, 4]]
    assert sorted(on("default").values_list("args", flat=True)) == [[0, 0], [2, 2]]
    for task in saved:
        assert on(task._state.db).get(pk=task.pk).args == task.args


def test_enqueue_bulk_goes_to_the_database_of_its_queue() -> None:
    ids = Task.objects.enqueue_bulk(tasks.add, [(1, 1), (2, 2)], queue="exports")
    assert sorted(on(SECOND).values_list("id", flat=True)) == sorted(ids)
    assert not on("default").exists()


def test_keys_are_unique_within_the_database_of_the_queue() -> None:
    first = Task.objects.enqueue(tasks.add, 1, 1, queue="reports", key="k")
    again = Task.objects.enqueue(tasks.add, 2, 2, queue="reports", key="k")
    assert (again.pk, again.deduplicated) == (first.pk, True)
    assert on(SECOND).get().args == [2, 2]


class Rollback(Exception):
    pass


def rolled_back(alias: str, action: Callable[[], object]) -> None:
    """Run ``action`` in a transaction on ``alias`` that is then rolled back."""
    try:
        with transaction.atomic(using=alias):
            action()
            raise Rollback
    except Rollback:
        pass


def test_enqueue_joins_the_transaction_of_its_own_database() -> None:
    rolled_back(SECOND, lambda: tasks.noop.enqueue(queue="reports"))
    assert not on(SECOND).exists()


def test_enqueue_on_another_server_is_not_atomic_with_the_default_database() -> None:
    # What docs/scaling.md warns about: rolling back the default database does not undo a
    # task written to the second server...
    rolled_back("default", lambda: tasks.noop.enqueue(queue="reports"))
    assert on(SECOND).count() == 1
    # ...and the on-commit pattern it recommends instead: enqueued only if the caller commits.
    rolled_back("default", lambda: transaction.on_commit(
        lambda: tasks.add.enqueue(1, 1, queue="reports")))
    assert on(SECOND).count() == 1
    with transaction.atomic():
        transaction.on_commit(lambda: tasks.add.enqueue(2, 2, queue="reports"))
        assert on(SECOND).count() == 1  # not before the commit
    assert on(SECOND).filter(args=[2, 2]).count() == 1


# -- claim, workers ---------------------------------------------------------------------------


def test_claim_reads_the_database_of_its_queues() -> None:
    report = tasks.noop.enqueue(queue="reports")
    tasks.noop.enqueue(queue="emails")
    [claimed] = Task.objects.claim("w", ["reports", "exports"])
    assert (claimed.pk, claimed._state.db) == (report.pk, SECOND)
    assert Task.objects.mark_succeeded(claimed)  # finished where it was read
    assert on(SECOND).get().status == Status.SUCCESSFUL
    [email] = Task.objects.claim("w")  # no queues: PGTASKS["DATABASE"] and its queues
    assert email._state.db == "default"
    with pytest.raises(ValueError, match="are on different databases"):
        Task.objects.claim("w", ["emails", "reports"])


def test_a_worker_drains_its_own_database_only() -> None:
    tasks.add.enqueue(1, 1, queue="reports")
    tasks.add.enqueue(2, 2, queue="emails")
    worker = Worker(burst=True, concurrency=2, using=SECOND, queues=queues_on(SECOND))
    assert worker.run(install_signals=False) == 0
    assert on(SECOND).get().status == Status.SUCCESSFUL
    assert on("default").get().status == Status.READY


def test_pipeline_stages_go_to_the_database_of_their_queue() -> None:
    stages = [tasks.noop.build(queue="reports"), tasks.noop.build(queue="emails")]
    with transaction.atomic():
        _enqueue_followups(stages, "default")
    assert [t._state.db for t in stages] == [SECOND, "default"]
    assert on(SECOND).count() == on("default").count() == 1


def test_run_pgtasks_runs_a_worker_per_database(env: dict[str, str]) -> None:
    for i in range(20):
        tasks.add.enqueue(i, 1, queue=["reports", "exports", "emails", "default"][i % 4])
    result = run(env, "run_pgtasks", "--burst", "--concurrency", "2")
    assert result.returncode == 0, result.stderr
    for alias in ("default", SECOND):
        assert on(alias).count() == 10
        assert set(on(alias).values_list("status", flat=True)) == {Status.SUCCESSFUL}
    # One worker process per database, each serving the queues its database holds.
    started = re.findall(r"Started worker process \d+ pid=\d+ database=(\S+)", result.stderr)
    assert sorted(started) == ["default", SECOND]
    assert re.search(r"queues=reports,exports ", result.stderr)
    assert re.search(r"queues=default,emails,urgent ", result.stderr)
    workers = {alias: set(on(alias).values_list("locked_by", flat=True)) for alias in
               ("default", SECOND)}
    assert len(workers["default"]) == len(workers[SECOND]) == 1
    assert workers["default"] != workers[SECOND]


def test_run_pgtasks_database_serves_that_database(env: dict[str, str]) -> None:
    tasks.noop.enqueue(queue="reports")
    tasks.noop.enqueue(queue="emails")
    result = run(env, "run_pgtasks", "--burst", "--database", SECOND)
    assert result.returncode == 0, result.stderr
    assert on(SECOND).get().status == Status.SUCCESSFUL
    assert on("default").get().status == Status.READY


def test_run_pgtasks_drains_what_a_moved_queue_left_behind(env: dict[str, str]) -> None:
    # Tasks of "reports" written to the default database before the queue moved to "second".
    left = Task.objects.enqueue(tasks.noop, queue="reports", using="default")
    result = run(env, "run_pgtasks", "--burst", "--database", "default", "--queues", "reports")
    assert result.returncode == 0, result.stderr
    assert "Queue(s) reports are configured on another database than 'default'" in (
        result.stderr)
    assert on("default").get(pk=left.pk).status == Status.SUCCESSFUL


# -- rescue and purge -------------------------------------------------------------------------


def test_workers_killed_on_both_databases_are_rescued_on_both(
    start: Callable[..., subprocess.Popen], env: dict[str, str],
) -> None:
    long = {"default": tasks.sleepy.enqueue(600, queue="emails"),
            SECOND: tasks.sleepy.enqueue(600, queue="reports")}
    workers = [start("run_pgtasks", "--database", alias, "--worker-id", f"doomed-{alias}")
               for alias in long]
    for alias, task in long.items():
        wait_until(lambda a=alias, t=task: on(a).get(pk=t.pk).status == Status.RUNNING)
    for worker in workers:  # as a crash would: no chance to give anything back
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    wait_until(lambda: all(rescue(alias, dry_run=True) for alias in long))
    result = run(env, "pgtasks_rescue")
    assert result.returncode == 0, result.stderr
    for alias, task in long.items():
        assert (f"Task id={task.pk} name={task.name} worker=doomed-{alias} "
                f"status=READY database={alias}") in result.stdout
        assert f"1 task(s) rescued on {alias}." in result.stdout
        row = on(alias).get(pk=task.pk)
        assert (row.status, row.attempt, row.interruptions) == (Status.READY, 0, 1)
        assert "WorkerLost" in row.error_text


def test_purge_covers_every_database(env: dict[str, str]) -> None:
    for queue in ("emails", "reports"):
        task = tasks.noop.enqueue(queue=queue)
        on(task._state.db).filter(pk=task.pk).update(
            status=Status.SUCCESSFUL, finished_at="2000-01-01T00:00:00Z")
    result = run(env, "pgtasks_purge")
    assert result.returncode == 0, result.stderr
    assert "Database default:" in result.stdout
    assert f"Database {SECOND}:" in result.stdout
    assert not on("default").exists()
    assert not on(SECOND).exists()


# -- checks -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        ({"default": {}, "reports": {"database": "nowhere"}}, "E040"),
        ({"default": {}, "reports": {"database": "not_postgres"}}, "E041"),
        ({"default": {}, "reports": {"database": 5}}, "E042"),
    ],
)
def test_a_queue_on_an_unusable_database_is_a_check_error(
    settings: Any, queues: dict, expected: str,
) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "QUEUES": queues}
    assert [e.id for e in check_queue_databases()] == [f"django_pgtasks.{expected}"]


def test_queue_options_must_be_a_dict(settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "QUEUES": {"default": {}, "reports": "second"}}
    assert "django_pgtasks.E014" in [e.id for e in check_settings()]


def test_a_queue_database_without_the_task_table_is_a_check_warning() -> None:
    assert check_queue_tables(databases=[SECOND]) == []
    found = {}

    def without_table() -> None:
        with connections[SECOND].cursor() as cursor:
            cursor.execute("ALTER TABLE pgtasks_task RENAME TO pgtasks_task_elsewhere")
        found[SECOND] = check_queue_tables(databases=[SECOND])
        found["default"] = check_queue_tables(databases=["default"])

    rolled_back(SECOND, without_table)  # the rename is undone
    [warning] = found[SECOND]
    assert warning.id == "django_pgtasks.W040"
    assert "'second' has no task table" in warning.msg
    assert "reports, exports" in warning.msg
    assert warning.hint == "Run: python manage.py migrate --database second"
    assert found["default"] == []  # only the aliases checked are queried
    assert check_queue_tables(databases=["default", SECOND]) == []


# -- periodic tasks ---------------------------------------------------------------------------


def test_a_schedule_runs_from_the_database_of_its_queue(settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "SCHEDULE": {
        "nightly": {"task": "tests.testapp.periodic.tick", "schedule": 60, "queue": "reports"},
    }}
    assert run_scheduler("default") == []  # not the default database's schedule
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgtasks_schedule")
        assert cursor.fetchone()[0] == 0
    with connections[SECOND].cursor() as cursor:  # first pass: the row, planned for later
        run_scheduler(SECOND)
        cursor.execute("UPDATE pgtasks_schedule SET next_run_at = now() - interval '1 second'")
    [task_id] = run_scheduler(SECOND)
    assert on(SECOND).get(pk=task_id).queue == "reports"
    assert not on("default").exists()


# -- one database down, the other keeps working -----------------------------------------------


@contextmanager
def database_down(alias: str) -> Iterator[None]:
    """Take one test database away: it refuses connections and its sessions are ended, as
    when its server goes down, then comes back. The server's other databases (other test runs)
    are not touched."""
    s = connections[alias].settings_dict
    name = s["NAME"]
    connections[alias].close()
    admin = psycopg.connect(dbname="postgres", user=s["USER"] or None,
                            password=s["PASSWORD"] or None, host=s["HOST"] or None,
                            port=s["PORT"] or None, autocommit=True)
    try:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        yield
    finally:
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')
        admin.close()


def test_one_database_going_down_does_not_stop_the_other(
    start: Callable[..., subprocess.Popen],
) -> None:
    worker = start("run_pgtasks", "--concurrency", "2")
    lines: list[str] = []

    def output_has(pattern: str) -> bool:
        # Reads the worker's output without blocking for longer than a line.
        import selectors

        selector = selectors.DefaultSelector()
        selector.register(worker.stdout, selectors.EVENT_READ)
        while selector.select(timeout=0.05):
            line = worker.stdout.readline()
            if not line:
                break
            lines.append(line)
        selector.close()
        return any(re.search(pattern, line) for line in lines)

    before = [tasks.noop.enqueue(queue=q) for q in ("emails", "reports", "default", "exports")]
    wait_until(lambda: all(on(t._state.db).get(pk=t.pk).status == Status.SUCCESSFUL
                           for t in before))

    with database_down(SECOND):
        # The second database's worker notices...
        wait_until(lambda: output_has(r"ERROR .*(Database error|database|connection)"))
        # ...while the default database's worker goes on running its queues.
        during = [tasks.add.enqueue(i, i, queue=("emails", "default", "urgent")[i % 3])
                  for i in range(30)]
        wait_until(lambda: on("default").filter(pk__in=[t.pk for t in during],
                                                status=Status.SUCCESSFUL).count() == 30)
        with pytest.raises(Exception, match="not currently accepting connections"):
            tasks.noop.enqueue(queue="reports")
        connections[SECOND].close()

    # Back: the same run_pgtasks serves the second database again.
    after = [tasks.add.enqueue(i, 1, queue=("reports", "exports")[i % 2]) for i in range(10)]
    wait_until(lambda: on(SECOND).filter(pk__in=[t.pk for t in after],
                                         status=Status.SUCCESSFUL).count() == 10)
    assert worker.poll() is None
    assert on(SECOND).exclude(status=Status.SUCCESSFUL).count() == 0


# -- the admin and pgtasks_stats ----------------------------------------------------------------


def same_pk_on_both() -> dict[str, Task]:
    """A failed task on each database, with the same primary key (ids repeat across servers)."""
    made = {alias: Task.objects.enqueue(tasks.always_fails, queue=queue) for alias, queue in
            (("default", "emails"), (SECOND, "reports"))}
    for alias, task in made.items():
        on(alias).filter(pk=task.pk).update(id=1, status=Status.FAILED, attempt=3,
                                            error_text=f"RuntimeError: on {alias}")
    return {alias: on(alias).get(pk=1) for alias in made}


def test_the_dashboard_shows_every_database(admin_client: Any) -> None:
    tasks.noop.enqueue(queue="emails")
    for _ in range(3):
        tasks.noop.enqueue(queue="exports")
    url = reverse("admin:django_pgtasks_task_dashboard")
    response = admin_client.get(url)
    assert response.status_code == 200
    sections = {s.database: s for s in response.context["sections"]}
    assert list(sections) == ["default", SECOND]
    waiting = {alias: {row.queue: row.waiting for row in s.snapshot.queues if row.waiting}
               for alias, s in sections.items()}
    assert waiting == {"default": {"emails": 1}, SECOND: {"exports": 3}}
    # One database at a time, and no other alias than a queue database.
    only = admin_client.get(url, {"database": SECOND})
    assert [s.database for s in only.context["sections"]] == [SECOND]
    assert admin_client.get(url, {"database": "not_postgres"}).status_code == 404


def test_the_task_list_and_actions_work_on_the_chosen_database(admin_client: Any) -> None:
    both = same_pk_on_both()
    changelist = reverse("admin:django_pgtasks_task_changelist")
    listed = {alias: [t.error_text for t in admin_client.get(
        changelist, {"database": alias} if alias != "default" else {}
    ).context["cl"].result_list] for alias in both}
    assert listed == {"default": ["RuntimeError: on default"],
                      SECOND: [f"RuntimeError: on {SECOND}"]}
    page = admin_client.get(reverse("admin:django_pgtasks_task_change", args=[1]),
                            {"database": SECOND})
    assert f"RuntimeError: on {SECOND}" in page.content.decode()
    # "Retry now" on the second database's task 1 leaves the default database's task 1 alone.
    url = f"{changelist}?database={SECOND}"
    chosen = admin_client.post(url, {"action": "retry_now_selected", "index": 0,
                                     "_selected_action": [1], "select_across": "0"})
    assert chosen.status_code == 200
    confirmed = admin_client.post(url, {"action": "retry_now_selected", "index": 0,
                                        "_selected_action": [1], "select_across": "0",
                                        "post": "yes"})
    assert confirmed.status_code == 302
    assert on(SECOND).get(pk=1).status == Status.READY
    assert on("default").get(pk=1).status == Status.FAILED


def test_pgtasks_stats_shows_every_database() -> None:
    tasks.noop.enqueue(queue="emails")
    tasks.noop.enqueue(queue="reports")
    text = call_command_output("pgtasks_stats")
    assert "== Database default ==" in text
    assert f"== Database {SECOND} ==" in text
    data = json.loads(call_command_output("pgtasks_stats", "--json"))
    queues = {d["database"]: {q["queue"]: q["waiting"] for q in d["queues"] if q["waiting"]}
              for d in data["databases"]}
    assert queues == {"default": {"emails": 1}, SECOND: {"reports": 1}}


# -- the django.tasks backend -----------------------------------------------------------------


def test_the_django_tasks_backend_routes_by_queue_and_finds_results_there(
    settings: Any,
) -> None:
    compat = pytest.importorskip("django_pgtasks.definition.framework")
    from tests.testapp import dj_tasks

    settings.TASKS = {**settings.TASKS, "default": {
        **settings.TASKS["default"], "QUEUES": ["default", "emails", "reports"]}}
    far = dj_tasks.add.using(queue_name="reports").enqueue(2, 3)
    near = dj_tasks.add.enqueue(1, 1)
    [row] = on(SECOND).all()
    assert far.id == f"{row.pk}@{SECOND}"  # primary keys repeat across databases
    assert near.id == str(on("default").get().pk)
    worker = Worker(burst=True, concurrency=1, using=SECOND, queues=["reports"])
    assert worker.run(install_signals=False) == 0
    fetched = dj_tasks.add.get_result(far.id)
    assert (fetched.id, fetched.status, fetched.return_value) == (
        far.id, compat.TaskResultStatus.SUCCESSFUL, 5)
    assert dj_tasks.add.get_result(near.id).status == compat.TaskResultStatus.READY
    for bad in (f"{row.pk}@nowhere", f"{row.pk}@default", f"x@{SECOND}"):
        with pytest.raises(compat.TaskResultDoesNotExist):
            dj_tasks.add.get_result(bad)
