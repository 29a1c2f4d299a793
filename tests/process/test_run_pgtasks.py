"""The ``run_pgtasks`` command as a process: options, signals, supervisor."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from django.core.management import CommandError, call_command

from django_pgtasks.models import Status, Task, WorkerProcess
from django_pgtasks.worker.loop import GC_THRESHOLD, Worker
from tests.helpers import Output, wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)




@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--processes", "0"], "--processes must be at least 1"),
        (["--queues", "default,nope"], "unknown queue(s) 'nope'"),
        (["--queues", ","], "unknown queue(s)"),
        (["--poll-interval", "0"], "--poll-interval must be greater than 0"),
        (["--poll-interval", "soon"], "'soon' is not a number"),
        (["--shutdown-grace", "-1"], "must not be negative"),
        (["--shutdown-grace", "nan"], "'nan' is not a finite number of seconds"),
        (["--poll-interval", "inf"], "'inf' is not a finite number of seconds"),
        (["--cancel-grace", "-0.5"], "must not be negative"),
        (["--cancel-grace", "5"], "--cancel-grace applies to the process pool only (this "
                                  "worker's pool is 'thread')"),
        (["--database", "missing"], "--database 'missing' is not an alias"),
        (["--log-level", "LOUD"], "invalid choice: 'LOUD'"),
        (["--concurrency", "many"], "invalid int value: 'many'"),
        (["--prefetch", "fast"], "'fast' is neither 'auto' nor a whole number"),
        (["--prefetch", "-1"], "must be 'auto' or 0 or more"),
    ],
)
def test_invalid_options_are_clear_errors(args: list[str], message: str) -> None:
    Task.objects.enqueue(tasks.noop)
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("run_pgtasks", "--burst", *args)
    assert Task.objects.get().status == Status.READY  # nothing was claimed


def test_invalid_option_in_a_real_process_exits_non_zero(run_command) -> None:
    result = run_command("run_pgtasks", "--concurrency", "0")
    assert result.returncode != 0
    assert "--concurrency must be at least 1." in result.stderr


def test_burst_drains_and_logs_one_greppable_line_per_outcome(run_command) -> None:
    ok = Task.objects.enqueue(tasks.add, 1, 2)
    bad = Task.objects.enqueue(tasks.fatal_failure)
    result = run_command("run_pgtasks", "--burst", "--worker-id", "w-log")
    assert result.returncode == 0, result.stderr
    assert re.search(
        rf"Task id={ok.pk} name=tests.testapp.tasks.add queue=default state=SUCCESSFUL "
        r"attempt=1/3 duration=\d+\.\d{3}s", result.stderr)
    assert re.search(rf"Task id={bad.pk} name=\S+ queue=default state=FAILED attempt=1/5 "
                     r"duration=\S+ error=django_pgtasks.exceptions.FatalError: \w", result.stderr)
    assert "Worker w-log stopped after 2 task(s)." in result.stderr


def test_sigterm_lets_running_tasks_finish_and_claims_nothing_more(start_command,
                                                                  tmp_path) -> None:
    gate = tmp_path / "gate"
    started = [tmp_path / f"started-{i}" for i in range(2)]
    running = [Task.objects.enqueue(tasks.waits_for, str(gate), started=str(path))
               for path in started]
    process = start_command("run_pgtasks", "--concurrency", "2", "--shutdown-grace", "20")
    out = Output(process)
    # Both handlers run (a claimed task not yet started is given back at shutdown).
    wait_until(lambda: all(path.exists() for path in started))
    waiting = Task.objects.enqueue(tasks.noop)
    process.send_signal(signal.SIGTERM)
    out.wait_for("SIGTERM received: finishing")
    gate.touch()  # the running tasks end only now, after the signal was handled
    assert process.wait(timeout=30) == 0, out.text
    for task in running:
        task.refresh_from_db()
        assert task.status == Status.SUCCESSFUL
    assert Task.objects.get(pk=waiting.pk).status == Status.READY
    assert "SIGTERM received: finishing 2 running task(s)" in out.text


def test_tasks_past_the_grace_period_are_given_back_without_spending_an_attempt(
        start_command, tmp_path) -> None:
    marker = tmp_path / "started"
    task = Task.objects.enqueue(tasks.waits_for, str(tmp_path / "never"), 60, str(marker))
    process = start_command("run_pgtasks", "--shutdown-grace", "0.5")
    out = Output(process)
    # RUNNING is not enough: a claimed task no thread has started yet is given back
    # unstarted (exit code 0), not interrupted past the grace period.
    wait_until(marker.exists, what="the handler to start")
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 1, out.text
    assert time.monotonic() - started < 10
    task.refresh_from_db()
    assert (task.status, task.attempt, task.interruptions) == (Status.READY, 0, 1)
    assert task.error_text.startswith("django_pgtasks.exceptions.WorkerShutdown: Worker ")
    assert len(Task.objects.claim("next-worker")) == 1  # due at once, not after a timeout


def test_second_signal_exits_at_once(start_command, tmp_path) -> None:
    marker = tmp_path / "started"
    task = Task.objects.enqueue(tasks.waits_for, str(tmp_path / "never"), 60, str(marker))
    process = start_command("run_pgtasks", "--shutdown-grace", "120")
    out = Output(process)
    wait_until(marker.exists, what="the handler to start")  # claimed is not yet running
    process.send_signal(signal.SIGINT)
    out.wait_for("SIGINT received")
    started = time.monotonic()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 1, out.text
    assert time.monotonic() - started < 10
    assert Task.objects.get(pk=task.pk).status == Status.READY


def test_sigusr1_prints_every_thread_stack_and_the_worker_goes_on(start_command,
                                                                   tmp_path) -> None:
    marker, release = tmp_path / "started", tmp_path / "release"
    task = Task.objects.enqueue(tasks.waits_for, str(release), 60, str(marker))
    process = start_command("run_pgtasks")
    out = Output(process)
    wait_until(marker.exists, what="the handler to start")
    process.send_signal(signal.SIGUSR1)
    out.wait_for(r"Thread 0x[0-9a-f]+ \(most recent call first\)")
    out.wait_for(r"File .*tests/testapp/tasks\.py.*in waits_for")  # the running handler
    release.touch()
    wait_until(lambda: Task.objects.get(pk=task.pk).status == Status.SUCCESSFUL,
               what="the task to finish after the dump")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, out.text


def test_prefetched_tasks_of_a_killed_worker_are_rescued_and_run_once(start_command,
                                                                      tmp_path) -> None:
    marker, release = tmp_path / "started", tmp_path / "release"
    blocker = Task.objects.enqueue(tasks.waits_for, str(release), 60, str(marker))
    waiting = Task.objects.enqueue_many(tasks.add.build(i, i) for i in range(3))
    victim = start_command("run_pgtasks", "--concurrency", "1", "--prefetch", "3",
                           "--worker-id", "victim")
    wait_until(marker.exists, what="the first task to start")
    wait_until(lambda: Task.objects.held_by("victim").count() == 4,
               what="1 running + 3 prefetched tasks")
    victim.kill()
    victim.wait(timeout=30)
    assert Task.objects.held_by("victim").count() == 4  # nobody recorded anything
    release.touch()
    heir = start_command("run_pgtasks", "--concurrency", "1", "--worker-id", "heir")
    out = Output(heir)
    wait_until(lambda: Task.objects.succeeded().count() == 4, what="every task to finish")
    heir.send_signal(signal.SIGTERM)
    assert heir.wait(timeout=60) == 0, out.text
    for task in Task.objects.filter(pk__in=[blocker.pk, *(t.pk for t in waiting)]):
        # Each ran to its end once, by the heir; the dead worker's claim spent no attempt.
        assert (task.status, task.attempt, task.interruptions) == (Status.SUCCESSFUL, 1, 1)
        assert task.worker_ids == ["heir"]  # the interrupted attempt left no entry
    assert sorted(Task.objects.filter(pk__in=[t.pk for t in waiting])
                  .values_list("result", flat=True)) == [0, 2, 4]


def not_killed(pid: int) -> bool:
    """A process that exists, is not a zombie, and has no SIGKILL pending (one that has
    cannot run another line)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    except FileNotFoundError:
        return False
    pending = int(fields["SigPnd"], 16) | int(fields["ShdPnd"], 16)
    return not fields["State"].strip().startswith(("Z", "X")) and not (
        pending & 1 << (signal.SIGKILL - 1))


def test_a_killed_supervisor_takes_its_worker_processes_with_it_at_the_tests_end(
        subprocess_env) -> None:
    """The tests' teardown kills what they started with every process under it: a
    supervisor's workers, in process groups of their own, would otherwise go on claiming the
    next test's tasks until they notice their supervisor is gone."""
    from tests.conftest import started_processes

    with started_processes(subprocess_env) as start:
        process = start("run_pgtasks", "--processes", "2", "--worker-id", "tree")
        out = Output(process)
        children = [int(out.wait_for(rf"Started worker process {i} pid=(\d+)").group(1))
                    for i in range(2)]
        # Each worker process moves to a group of its own as it starts.
        wait_until(lambda: all(os.getpgid(pid) == pid for pid in children), 30,
                   "the worker processes to be in groups of their own")
    assert not [pid for pid in children if not_killed(pid)]


def test_supervisor_restarts_a_killed_worker_process(start_command, tmp_path) -> None:
    # Four tasks first (the highest priority) that run until the test opens their gate: two
    # for each process's two threads, so the process killed holds running tasks however slow
    # the machine.
    gate = tmp_path / "gate"
    started = [tmp_path / f"started-{i}" for i in range(4)]
    held = {task.pk: path for task, path in zip(Task.objects.enqueue_many(
        tasks.waits_for.build(str(gate), 60, str(path), priority=200) for path in started),
        started, strict=True)}
    Task.objects.enqueue_many(tasks.sleepy.build(0.02) for _ in range(296))
    process = start_command("run_pgtasks", "--processes", "2", "--concurrency", "2",
                            "--worker-id", "sup")
    out = Output(process)
    first = int(out.wait_for(r"Started worker process 0 pid=(\d+)").group(1))
    out.wait_for(r"Started worker process 1 pid=(\d+)")
    wait_until(lambda: any(held[pk].exists() for pk in Task.objects.held_by("sup-0")
                           .filter(pk__in=held).values_list("pk", flat=True)),
               what="worker process 0 running a task held at the gate")
    os.kill(first, signal.SIGKILL)
    gate.touch()
    out.wait_for(rf"Worker process 0 pid={first} exited with code -9; restarting")
    line = len(out.lines)
    replacement = int(out.wait_for(r"Started worker process 0 pid=(\d+)", after=line).group(1))
    assert replacement != first
    # The tasks the killed process held are rescued by the live workers and run again, as an
    # interruption: no attempt spent. (A held task may also have finished after all: a
    # statement the process sent just before it died still commits. Such a task ran once,
    # unrescued.)
    wait_until(lambda: Task.objects.succeeded().count() == 300, timeout=120)
    interrupted = dict(Task.objects.values_list("pk", "interruptions"))
    rescued = {pk for pk, errors in Task.objects.values_list("pk", "errors")
               if any("worker sup-0 stopped" in str(error) for error in errors)}
    assert rescued, "no task of the killed process was rescued"
    # Every interrupted task is one the rescue took from the killed process, none of the
    # live one's. (Not checked against the tasks held by sup-0 read right after the kill: a
    # claim whose COMMIT the process sent just before it died commits a moment later.)
    assert {pk for pk, n in interrupted.items() if n == 1} == rescued
    assert set(Task.objects.values_list("attempt", flat=True)) == {1}
    # The replacement works under a new id (registered as such: whether it also claims
    # some of the 300 tasks before the live process drains them depends on the machine).
    wait_until(lambda: WorkerProcess.objects.filter(name="sup-0.1").exists(), timeout=60,
               what="the replacement to register as sup-0.1")
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0, out.text
    assert "All worker processes stopped." in out.text


def test_forked_worker_processes_with_a_connection_pool_run_each_task_once(
        subprocess_env) -> None:
    # On Linux the children are forked from the supervisor (worker/supervisor.py), which
    # closes its connections and pools first: each child opens its own pool.
    from tests.conftest import ROOT, manage_command

    Task.objects.enqueue_many(tasks.add.build(i, i) for i in range(400))
    result = subprocess.run(
        manage_command("run_pgtasks", "--burst", "--processes", "2", "--concurrency", "3",
                       "--worker-id", "forked"),
        env={**subprocess_env, "PGTASKS_TEST_POOL": "2"}, cwd=ROOT, capture_output=True,
        text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert Task.objects.succeeded().count() == 400
    assert set(Task.objects.values_list("attempt", flat=True)) == {1}
    workers = {ids[0] for ids in Task.objects.values_list("worker_ids", flat=True)}
    assert workers, workers
    assert workers <= {"forked-0", "forked-1"}, workers
    assert "Started worker process 1" in result.stderr


def test_processes_auto_starts_a_worker_process_per_usable_cpu(subprocess_env) -> None:
    """PGTASKS["PROCESSES"] = "auto" (the default) and no --processes: one worker process per
    CPU the command may use, each running tasks (the connection budget has room here)."""
    from django_pgtasks.worker.process_count import usable_cpus
    from tests.conftest import ROOT, manage_command

    cpus = usable_cpus()
    Task.objects.enqueue_many(tasks.add.build(i, i) for i in range(200))
    result = subprocess.run(
        manage_command("run_pgtasks", "--burst", "--concurrency", "2", "--worker-id", "auto"),
        env={**subprocess_env, "PGTASKS_TEST_PROCESSES": "auto"}, cwd=ROOT,
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert Task.objects.succeeded().count() == 200
    started = re.findall(r"Worker (auto-\d+) started", result.stderr)
    assert sorted(started) == [f"auto-{i}" for i in range(cpus)], result.stderr
    if cpus == 1:
        return
    workers = {ids[0] for ids in Task.objects.values_list("worker_ids", flat=True)}
    assert workers <= set(started), workers


def test_a_worker_process_runs_every_side_job(subprocess_env) -> None:
    """Rescue, purge (of tasks and of events), partitions and scheduler register when their
    modules are imported: a fresh process that loads the worker (as run_pgtasks does) must
    have them all, not only those some other import happened to load."""
    code = ("import django; django.setup(); import django_pgtasks.worker.loop; "
            "from django_pgtasks.definition import maintenance_jobs as maintenance; "
            "print(sorted(job.name for job in maintenance.jobs()))")
    process = subprocess.run([sys.executable, "-c", code], env=subprocess_env,
                             capture_output=True, text=True, timeout=120)
    assert process.returncode == 0, process.stderr
    assert process.stdout.strip() == (
        "['expire events', 'partitions', 'purge', 'rescue', 'scheduler']")



def test_a_task_raising_system_exit_in_burst_mode_lets_the_worker_out_at_once(
        start_command) -> None:
    from tests.testapp import dj_tasks

    exiting = [Task.objects.enqueue(tasks.exits).pk, int(dj_tasks.exits.enqueue().id),
               Task.objects.enqueue(tasks.async_exits).pk]
    others = Task.objects.enqueue_many(tasks.add.build(i, i) for i in range(5))
    # A minute-long poll interval: a worker kept waiting by anything lingers far past the
    # bound, whatever the machine's load.
    process = start_command("run_pgtasks", "--burst", "--poll-interval", "60")
    out = Output(process)
    wait_until(lambda: Task.objects.filter(pk__in=exiting, status=Status.FAILED).count() == 3
               and Task.objects.succeeded().count() == len(others),
               what="every task to be recorded")
    emptied = time.monotonic()
    assert process.wait(timeout=90) == 0, out.text
    assert time.monotonic() - emptied < 15, out.text
    for pk in exiting:
        assert re.search(rf"Task id={pk} name=\S+ queue=default state=FAILED "
                         r".* error=SystemExit: 3", out.text), out.text


def test_the_process_ends_as_soon_as_the_worker_stopped(start_command) -> None:
    """Nothing outlives the worker's last line: no thread waits out a poll interval, no
    session a timeout. The intervals are made a minute long, so that a process kept alive by
    any of them lingers far past the bound, whatever the machine's load."""
    Task.objects.enqueue(tasks.noop)
    process = start_command("run_pgtasks", "--worker-id", "quick-exit",
                            "--poll-interval", "60")
    out = Output(process)
    wait_until(lambda: Task.objects.succeeded().exists())
    process.send_signal(signal.SIGTERM)
    out.wait_for(r"Worker quick-exit stopped after 1 task\(s\)\.")
    stopped = time.monotonic()
    assert process.wait(timeout=90) == 0, out.text
    assert time.monotonic() - stopped < 15, out.text


def test_the_console_shows_each_state_of_a_django_task_once(run_command) -> None:
    """Django logs the state changes of its tasks on its own logger; the worker logs them
    too, with the attempt, duration and error. The console shows the worker's line only."""
    from tests.testapp import dj_tasks

    good, bad = dj_tasks.add.enqueue(1, 2), dj_tasks.fails.enqueue("disk full")
    result = run_command("run_pgtasks", "--burst")
    assert result.returncode == 0, result.stderr
    for task_id, state in [(good.id, "SUCCESSFUL"), (bad.id, "FAILED")]:
        for shown in ("RUNNING", state):
            lines = [line for line in result.stderr.splitlines()
                     if f"id={task_id} " in line and f"state={shown}" in line]
            assert len(lines) == 1, result.stderr
            assert "name=tests.testapp.dj_tasks." in lines[0], result.stderr
    assert "Traceback" not in result.stderr, result.stderr


def test_sigterm_counts_the_running_tasks_not_the_prefetched_ones(start_command,
                                                                  tmp_path) -> None:
    gate = tmp_path / "gate"
    started = [tmp_path / f"started-{i}" for i in range(3)]
    Task.objects.enqueue_many(tasks.waits_for.build(str(gate), 60, str(path))
                              for path in started)
    process = start_command("run_pgtasks", "--concurrency", "2", "--prefetch", "1",
                            "--worker-id", "counting")
    out = Output(process)
    wait_until(lambda: Task.objects.held_by("counting").count() == 3
               and sum(path.exists() for path in started) == 2,
               what="two running tasks and one prefetched")
    process.send_signal(signal.SIGTERM)
    out.wait_for("SIGTERM received: finishing")
    gate.touch()
    assert process.wait(timeout=60) == 0, out.text
    assert "SIGTERM received: finishing 2 running task(s)" in out.text, out.text
    assert "gave back 1 prefetched task(s)" in out.text, out.text


def test_a_second_signal_still_prints_the_outcome_of_every_recorded_task(start_command,
                                                                        tmp_path) -> None:
    marker = tmp_path / "started"
    quick = Task.objects.enqueue(tasks.add, 1, 2)
    Task.objects.enqueue(tasks.waits_for, str(tmp_path / "never"), 60, str(marker))
    process = start_command("run_pgtasks", "--concurrency", "1", "--prefetch", "0",
                            "--shutdown-grace", "120", "--worker-id", "twice")
    out = Output(process)
    wait_until(lambda: marker.exists()
               and Task.objects.get(pk=quick.pk).status == Status.SUCCESSFUL,
               what="the quick task recorded and the long one running")
    process.send_signal(signal.SIGINT)
    out.wait_for("SIGINT received")
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 1, out.text
    line = rf"Task id={quick.pk} name=tests.testapp.tasks.add queue=default state=SUCCESSFUL"
    assert re.search(line, out.text), out.text
    assert out.text.index("state=SUCCESSFUL") < out.text.index("Worker twice stopped"), out.text


def test_the_worker_freezes_what_its_start_up_made_out_of_the_collectors_passes(
        run_command) -> None:
    """The command's worker owns its process: Django, the apps and the handlers' modules are
    frozen out of the garbage collector's generations once it has started (its full passes
    would walk them again and again as claimed tasks come and go), and the collector's first
    pass waits for ``GC_THRESHOLD`` new objects. A worker run inside a process it does not
    own (a test's, an application's thread) leaves the collector alone."""
    task = Task.objects.enqueue(tasks.frozen_objects)
    threshold = Task.objects.enqueue(tasks.gc_first_threshold)
    result = run_command("run_pgtasks", "--burst")
    assert result.returncode == 0, result.stderr
    task.refresh_from_db()
    threshold.refresh_from_db()
    assert task.status == threshold.status == Status.SUCCESSFUL
    assert task.result > 10_000  # Django and the apps alone are well over that
    assert threshold.result == GC_THRESHOLD != gc.get_threshold()[0]

    in_process = Task.objects.enqueue(tasks.frozen_objects)
    in_process_threshold = Task.objects.enqueue(tasks.gc_first_threshold)
    before = gc.get_freeze_count(), gc.get_threshold()
    Worker(burst=True).run(install_signals=False)
    in_process.refresh_from_db()
    in_process_threshold.refresh_from_db()
    assert in_process.result == before[0]
    assert in_process_threshold.result == before[1][0]
    assert gc.get_threshold() == before[1]
