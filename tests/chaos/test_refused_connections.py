"""More pool threads than the server has connections for: what a refused connection costs.

The issue's case was ``--concurrency 500`` against ``max_connections = 100`` and 3,000 tasks
that use the database; here its ratio is kept at a size a CI machine of two cores runs: 100
threads against a server of its own (``tests/few_connections.py``) that accepts 20.
"""

from __future__ import annotations

import os

import pytest
from django.db.models import Count

from django_pgtasks.models import Task
from tests.conftest import ROOT, started_processes
from tests.few_connections import few_connections_server
from tests.helpers import stop_processes, wait_until
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.slow]

MAX_CONNECTIONS = 20
THREADS = 100
N_TASKS = 300
#: The start of the worker's one warning.
REFUSED = "the database refused a connection to a pool thread"


@pytest.mark.timeout(600)
def test_tasks_whose_thread_cannot_connect_go_back_unspent_and_each_runs_once(
        django_db_blocker) -> None:
    """Every handler writes through the database: a thread the server refuses gives its task
    back before the handler starts, as if unclaimed (no attempt and no interruption spent),
    and the worker warns once and backs off. Every task ends SUCCESSFUL after exactly one
    execution of its handler."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(ROOT),
               PYTHONUNBUFFERED="1")
    with django_db_blocker.unblock(), few_connections_server(MAX_CONNECTIONS) as server, \
            started_processes({**env, **server.env}) as start:
        db = server.alias
        Task.objects.enqueue_bulk(tasks.chaos_at_least_once, [()] * N_TASKS, using=db)
        process = start("run_pgtasks", "--concurrency", str(THREADS), "--log-level", "WARNING")
        try:
            wait_until(lambda: Task.objects.using(db).finished().count() == N_TASKS
                       or process.poll() is not None, timeout=400, what="every task to end")
        finally:
            output = stop_processes([process])[0]
        assert process.returncode == 0, output
        ends = Task.objects.using(db).values_list("status", "attempt", "interruptions")
        assert set(ends) == {("SUCCESSFUL", 1, 0)}, sorted(set(ends))
        runs = Execution.objects.using(db).aggregate(n=Count("id"),
                                                     tasks=Count("task_id", distinct=True))
        assert runs == {"n": N_TASKS, "tasks": N_TASKS}  # each task's handler ran once
        # The fault was real (threads were refused) and the worker said what to do, once.
        assert output.count(REFUSED) == 1, output
        assert "lower --concurrency, raise the server's max_connections" in output, output
