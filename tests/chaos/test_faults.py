"""Faults the worker survives: terminated backends and the database going away.

Workers run as real ``run_pgtasks`` processes. Their sessions carry the application_name
"pgtasks worker", which is how the tests find and terminate them from the database side.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from django.db import connection, connections

from django_pgtasks.models import Task, WorkerProcess
from tests.helpers import Output, terminate_worker_backends, wait_until
from tests.proxy import FlakyProxy
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow,
              pytest.mark.usefixtures("sessions_terminated")]


def worker_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity "
                       "WHERE application_name = 'pgtasks worker' AND datname = current_database()")
        return cursor.fetchone()[0]




def test_worker_survives_terminated_backends_while_idle_and_while_busy(start_command,
                                                                      tmp_path) -> None:
    process = start_command("run_pgtasks", "--concurrency", "4", "--worker-id", "survivor")
    out = Output(process)
    wait_until(lambda: WorkerProcess.objects.filter(name="survivor").exists())
    # Idle: its four sessions (the watchdog's, the maintainer's, the releaser's, the loop's
    # once it has claimed) are killed from the database side.
    wait_until(lambda: worker_backends() == 4, timeout=30, what="the worker's four sessions")
    assert terminate_worker_backends() == 4
    first = Task.objects.enqueue_many(tasks.noop.build() for _ in range(20))
    wait_until(lambda: Task.objects.succeeded().count() == len(first), timeout=90)
    # Busy: terminated while handlers run and before their completions are written. The
    # handlers run until the test opens their gate, so the four are seen running however
    # slow the machine (a fixed run time left a window a loaded machine could miss).
    gate = tmp_path / "gate"
    started = [tmp_path / f"started-{i}" for i in range(8)]
    busy = Task.objects.enqueue_many(tasks.waits_for.build(str(gate), 60, str(path))
                                     for path in started)
    wait_until(lambda: sum(path.exists() for path in started) == 4,
               what="four handlers running")
    assert terminate_worker_backends() >= 2
    gate.touch()
    wait_until(lambda: Task.objects.succeeded().count() == len(first) + len(busy), timeout=60)
    assert process.poll() is None, out.text  # still running: no crash, no crash loop
    assert "terminating connection due to administrator command" in out.text
    # Nothing was rescued behind the live worker's back: every task ran once.
    assert set(Task.objects.values_list("attempt", flat=True)) == {1}
    assert WorkerProcess.objects.filter(name="survivor").exists()


def test_worker_rides_out_the_database_going_away(start_command, subprocess_env,
                                                  tmp_path) -> None:
    s = connection.settings_dict
    proxy = FlakyProxy((s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)))
    subprocess_env.update(PGHOST="127.0.0.1", PGPORT=str(proxy.port))
    gate = tmp_path / "gate"
    try:
        # The last four (the lowest priority) run until the outage has been seen: work is
        # left for after it however fast the others drain.
        Task.objects.enqueue_many([*(tasks.sleepy.build(0.3) for _ in range(36)),
                                   *(tasks.waits_for.build(str(gate), 60, priority=0)
                                     for _ in range(4))])
        process = start_command("run_pgtasks", "--concurrency", "4", "--worker-id", "rider")
        out = Output(process)
        wait_until(lambda: Task.objects.succeeded().count() >= 8, timeout=90)
        # The server "restarts": every session ends, and for 3 seconds nobody can connect.
        done_before = Task.objects.succeeded().count()
        assert proxy.cut(3.0) >= 2
        # The worker tries to reconnect during the outage, and is refused.
        wait_until(lambda: proxy.refused >= 2, 30, "the worker to try to reconnect")
        gate.touch()
        wait_until(lambda: Task.objects.succeeded().count() == 40, timeout=60)
        assert done_before < 40  # some of the work was left for after the outage
        assert process.poll() is None, out.text
        # The worker saw the outage. Which of its sessions reports it first depends on what
        # each was doing at the cut (claiming, recording outcomes, a heartbeat); its listening
        # session is always connected, so it always reports losing it.
        assert "Listener connection lost" in out.text, out.text
        # Tasks whose completion was due during the outage were recorded once it was back.
        assert not Task.objects.running().exists()
        assert max(Task.objects.values_list("attempt", flat=True)) <= 2
    finally:
        proxy.close()


RESTART = os.environ.get("PGTASKS_TEST_RESTART_SERVER") == "1"
# Other test processes (pytest-xdist) would lose their server in the middle of their tests.
ALONE = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) <= 1


@pytest.mark.skipif(not RESTART or not shutil.which("pg_ctlcluster"),
                    reason="restarts the PostgreSQL server: set PGTASKS_TEST_RESTART_SERVER=1 "
                           "on a machine whose local cluster may be restarted (CI does)")
@pytest.mark.skipif(not ALONE, reason="restarts the server every test uses: run it on its own "
                                      "(-n 0), as CI does after the suite")
def test_worker_survives_a_real_server_restart(start_command) -> None:
    Task.objects.enqueue_many(tasks.sleepy.build(0.3) for _ in range(40))
    process = start_command("run_pgtasks", "--concurrency", "4", "--worker-id", "restart")
    out = Output(process)
    wait_until(lambda: Task.objects.succeeded().count() >= 8, timeout=90)
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart",
                    "--", "-m", "fast"], check=True, timeout=120)
    connections.close_all()  # this test's own session ended with the restart too
    wait_until(lambda: Task.objects.succeeded().count() == 40, timeout=90)
    assert process.poll() is None, out.text
    assert not Task.objects.running().exists()
    assert max(Task.objects.values_list("attempt", flat=True)) <= 2
