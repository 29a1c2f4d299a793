"""Sample task handlers used across the test suite."""

from __future__ import annotations

from typing import Any

from django_pgtasks import FatalError, pgtask
from django_pgtasks.definition.registry import TaskContext

from .models import Execution
from .workload import pause, wait_for_gate


@pgtask
def noop() -> None:
    """Does nothing."""


@pgtask
def takes_anything(*args: Any, **kwargs: Any) -> None:
    """Takes any arguments: for tests of what the payload stores."""


@pgtask
def add(a: int, b: int) -> int:
    return a + b


@pgtask(context=True)
def log_execution(ctx: TaskContext) -> None:
    """At-least-once: the log row commits before the completion does."""
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)


@pgtask(context=True, atomic=True)
def log_execution_atomic(ctx: TaskContext) -> None:
    """Exactly-once: the log row commits in the completion's transaction."""
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)


@pgtask(context=True, max_attempts=5, backoff="linear")
def flaky(ctx: TaskContext, fail_times: int) -> str:
    """Fails ``fail_times`` attempts, then succeeds."""
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)
    if ctx.attempt <= fail_times:
        raise ConnectionError(f"attempt {ctx.attempt} failed")
    return "ok"


@pgtask(max_attempts=3)
def always_fails(message: str = "boom") -> None:
    raise RuntimeError(message)


@pgtask(max_attempts=5)
def fatal_failure() -> None:
    raise FatalError("the input can never work")


@pgtask(max_attempts=5, fatal=(LookupError,))
def declared_fatal() -> None:
    raise KeyError("missing")


@pgtask
def returns_unserializable() -> object:
    return object()


@pgtask
async def async_add(a: int, b: int) -> int:
    return a + b


@pgtask(max_attempts=1)
def fails_loudly(size: int) -> None:
    raise RuntimeError("x" * size)


@pgtask(context=True, atomic=True)
def cancelled_while_running(ctx: TaskContext) -> None:
    """Writes a row, then an operator cancels the task from another connection."""
    import threading

    from django.db import connections

    from django_pgtasks.models import Status, Task

    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)

    def cancel_elsewhere() -> None:
        try:
            Task.objects.filter(pk=ctx.task_id).update(status=Status.CANCELLED)
        finally:
            connections.close_all()

    thread = threading.Thread(target=cancel_elsewhere)
    thread.start()
    thread.join()


@pgtask
def sleepy(seconds: float) -> None:
    pause(seconds)


@pgtask
def waits_for(path: str, timeout: float = 60, started: str | None = None) -> None:
    """Runs until the file ``path`` exists (a test opens the gate when it is ready); creates
    the file ``started``, if given, as soon as it runs."""
    if started is not None:
        open(started, "w").close()
    wait_for_gate(path, timeout)


@pgtask(max_attempts=1)
def exits() -> None:
    raise SystemExit(3)


@pgtask(max_attempts=1)
async def async_exits() -> None:
    raise SystemExit(3)


@pgtask(timeout=0.5, max_attempts=1, context=True)
def hangs(ctx: TaskContext, seconds: float) -> None:
    """Overruns its time limit; logs an execution row when it finally returns."""
    pause(seconds)
    Execution.objects.create(task_id=ctx.task_id, worker="late", attempt=ctx.attempt)


@pgtask(timeout=0.5, max_attempts=1, context=True)
def hangs_until(ctx: TaskContext, gate: str) -> None:
    """Overruns its time limit until the file ``gate`` exists; then logs an execution row."""
    wait_for_gate(gate)
    Execution.objects.create(task_id=ctx.task_id, worker="late", attempt=ctx.attempt)


@pgtask(timeout=0.3, max_attempts=1)
async def async_hangs() -> None:
    import asyncio

    await asyncio.sleep(30)


@pgtask(context=True, atomic=True, max_attempts=10)
def chaos_exactly_once(ctx: TaskContext) -> None:
    """Chaos test, exactly-once mode: the log row commits with the completion, or not at all."""
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)


@pgtask(context=True, max_attempts=10)
def chaos_at_least_once(ctx: TaskContext) -> None:
    """Chaos test, at-least-once mode: the log row commits before the completion."""
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)


# A three-stage pipeline. Each stage's effect (an Execution row naming the pipeline and the
# stage) commits with the stage's completion and the enqueue of the next stage.
@pgtask(context=True, atomic=True, max_attempts=10)
def extract(ctx: TaskContext, size: int) -> int:
    Execution.objects.create(task_id=ctx.task_id, worker="extract", attempt=ctx.attempt)
    ctx.then(transform, ctx.task_id, size * 2)
    return size


@pgtask(context=True, atomic=True, max_attempts=10)
def transform(ctx: TaskContext, root: int, size: int) -> int:
    if size < 0:
        raise FatalError(f"cannot transform a negative size {size}")
    Execution.objects.create(task_id=root, worker="transform", attempt=ctx.attempt)
    ctx.then(load, root, size + 1, stage="load")
    return size


@pgtask(context=True, atomic=True, max_attempts=10)
def load(ctx: TaskContext, root: int, size: int) -> int:
    Execution.objects.create(task_id=root, worker="load", attempt=ctx.attempt)
    return size


@pgtask(context=True, max_attempts=10)
def divide_sometimes(ctx: TaskContext, seed: int) -> float:
    """Logs each execution, then divides by zero about one time in three."""
    import random

    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)
    if random.Random(seed * 1000 + ctx.attempt).random() < 0.35:
        return 1 / 0
    return 1.0


@pgtask
def leaves_a_transaction_open(marker: str) -> None:
    """Opens a transaction, writes, and returns without ending it (a handler's bug)."""
    from django.db import transaction

    transaction.atomic().__enter__()
    Execution.objects.create(task_id=0, worker=marker)


@pgtask
def in_a_transaction() -> bool:
    """Whether this thread's connection is inside a transaction when the handler starts."""
    from django.db import connection

    return connection.in_atomic_block


# -- workflows (tests/integration/test_workflows.py, tests/process/test_workflows.py) -----


@pgtask(context=True, max_attempts=1)
def wf_step(ctx: TaskContext, label: str, fail: bool = False) -> str:
    """Records its run (``worker`` = its label) and returns its label; fails if asked."""
    Execution.objects.create(task_id=ctx.task_id, worker=label, attempt=ctx.attempt)
    if fail:
        raise ValueError(f"step {label} fails")
    return label


@pgtask(context=True)
def wf_add(ctx: TaskContext, n: int) -> int:
    """``n`` plus the previous step's result (a chain), if it has one."""
    return n + (ctx.parent_result() if ctx.parents() else 0)


@pgtask(context=True)
def wf_collect(ctx: TaskContext) -> list[Any]:
    """A group's callback: records its run and returns each member's status and result."""
    Execution.objects.create(task_id=ctx.task_id, worker="callback", attempt=ctx.attempt)
    return [[outcome.status, outcome.result] for outcome in ctx.parents()]


@pgtask(context=True)
def wf_slow_step(ctx: TaskContext, label: str, gate: str | None = None) -> str:
    """Records its run (``worker`` = the worker's id) after 50 ms, and with ``gate`` once the
    file ``gate`` exists."""
    pause(0.05)
    if gate is not None:
        wait_for_gate(gate)
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)
    return label


@pgtask(context=True, atomic=True)
def wf_count_once(ctx: TaskContext) -> dict[str, int]:
    """A large group's callback whose log row commits with its outcome: how many members
    ended how (a list of 100,000 outcomes would exceed the result limit)."""
    Execution.objects.create(task_id=ctx.task_id, worker="callback", attempt=ctx.attempt)
    counts: dict[str, int] = {}
    for outcome in ctx.parents():
        counts[outcome.status] = counts.get(outcome.status, 0) + 1
    return counts


@pgtask(context=True, atomic=True)
def wf_collect_once(ctx: TaskContext) -> list[Any]:
    """A group's callback whose log row commits with its outcome: exactly once."""
    Execution.objects.create(task_id=ctx.task_id, worker="callback", attempt=ctx.attempt)
    return [outcome.status for outcome in ctx.parents()]


# -- releases and ends under faults (tests/integration/test_release.py) ------------------------


@pgtask(context=True, max_attempts=1)
def wf_flaky(ctx: TaskContext, label: str) -> str:
    """Fails the first time it runs (its log row stays), succeeds afterwards."""
    first = not Execution.objects.filter(worker=label).exists()
    Execution.objects.create(task_id=ctx.task_id, worker=label, attempt=ctx.attempt)
    if first:
        raise ValueError(f"{label} fails the first time")
    return label


@pgtask(context=True, atomic=True, max_attempts=1)
def atomic_after_lock(ctx: TaskContext, key: int) -> str:
    """Exactly-once: writes its log row, then waits for the advisory lock ``key`` (held by a
    test) inside its transaction, whose start time is then long past when it ends."""
    from django.db import connection

    Execution.objects.create(task_id=ctx.task_id, worker="atomic", attempt=ctx.attempt)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
    return "done"


# -- hostile handlers, for the process pool (tests/process/test_process_pool.py) -------------


def _no_backoff(attempt: int) -> float:
    return 0.0


def process_is_gone(pid: int) -> bool:
    """Whether process ``pid`` no longer runs (it does not exist, or is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rpartition(b")")[2].split()[0] in (b"Z", b"X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True


def record_run(ctx: TaskContext) -> None:
    """One Execution row per run: ``pid=<this process> ppid=<its parent> alive=<how many
    processes of the task's earlier runs still run now>`` (0, or two runs overlapped)."""
    import os
    import re

    earlier = Execution.objects.filter(task_id=ctx.task_id).values_list("worker", flat=True)
    pids = [int(m.group(1)) for w in earlier if (m := re.match(r"pid=(\d+) ", w))]
    alive = sum(1 for pid in pids if not process_is_gone(pid))
    Execution.objects.create(task_id=ctx.task_id, attempt=ctx.attempt,
                             worker=f"pid={os.getpid()} ppid={os.getppid()} alive={alive}")


def misbehave(how: str) -> None:
    import ctypes
    import os
    import signal

    if how == "sleep":  # hung in C
        pause(3600)  # a sleep in C
    elif how == "busy":  # a pure-Python busy loop
        while True:
            pass
    elif how == "ignore_term":  # ignores SIGTERM, hung in C
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        pause(3600)
    elif how == "segfault":
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(3)
    elif how == "kill":  # what the out-of-memory killer does
        os.kill(os.getpid(), signal.SIGKILL)


@pgtask(context=True, timeout=1, max_attempts=2, backoff=_no_backoff)
def hostile(ctx: TaskContext, how: str) -> int:
    """Records its run, then misbehaves as ``how`` says (within a 1 s time limit)."""
    import os

    record_run(ctx)
    misbehave(how)
    return os.getpid()


_hoard: list[bytes] = []


@pgtask(context=True)
def hog(ctx: TaskContext, megabytes: int) -> int:
    """Keeps ``megabytes`` MiB for good (a leak), touched so that they are resident."""
    import os

    record_run(ctx)
    _hoard.append(b"x" * (megabytes * 1024 * 1024))
    return os.getpid()


@pgtask(context=True)
def where_am_i(ctx: TaskContext) -> dict[str, Any]:
    """This process, and its connection to the task database: its backend's pid, and whether
    that backend started after this process did (a connection of its own, not one it
    inherited)."""
    import os

    from django.db import connection

    with open("/proc/self/stat", "rb") as stat:
        started_ticks = int(stat.read().rpartition(b")")[2].split()[19])
    with open("/proc/stat") as stat:
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime"))
    process_start = boot + started_ticks / os.sysconf("SC_CLK_TCK")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid(), extract(epoch FROM backend_start) "
                       "FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        backend, backend_start = cursor.fetchone()
    return {"pid": os.getpid(), "backend": backend,
            "own_connection": float(backend_start) >= process_start - 0.02}


@pgtask(context=True, atomic=True, timeout=1, max_attempts=3, backoff=_no_backoff)
def atomic_hangs_once(ctx: TaskContext) -> int:
    """Exactly-once: writes its row, then (first attempt only) hangs past its time limit."""
    import os

    Execution.objects.create(task_id=ctx.task_id, worker=f"pid={os.getpid()} ",
                             attempt=ctx.attempt)
    if ctx.attempt == 1:
        pause(3600)
    return os.getpid()


@pgtask(context=True)
def waits_for_cancel(ctx: TaskContext, started: str) -> str:
    """Runs until cancelled (cooperatively), then says so."""
    open(started, "w").close()
    while not ctx.wait(30):
        pass
    ctx.raise_if_cancelled()
    return "not cancelled"


@pgtask(context=True)
def records_and_waits(ctx: TaskContext, gate: str) -> int:
    """Records its run, then waits (without a time limit of its task) until the file ``gate``
    exists."""
    import os

    record_run(ctx)
    wait_for_gate(gate)
    return os.getpid()


@pgtask
def frozen_objects() -> int:
    """How many objects of this process the garbage collector keeps frozen (gc.freeze)."""
    import gc

    return gc.get_freeze_count()


@pgtask
def gc_first_threshold() -> int:
    """The garbage collector's first threshold in this process (gc.set_threshold)."""
    import gc

    return gc.get_threshold()[0]


@pgtask(context=True, max_attempts=3)
def runs_on_after_cancel(ctx: TaskContext, noticed: str, gate: str) -> int:
    """Records its run, sees its cancellation (then writes the file ``noticed``) and runs on
    regardless until the file ``gate`` exists; returns its pid."""
    import os

    record_run(ctx)
    while not ctx.wait(30):
        pass
    open(noticed, "w").close()
    wait_for_gate(gate)
    return os.getpid()


@pgtask(context=True, atomic=True, max_attempts=3)
def atomic_hangs(ctx: TaskContext, started: str) -> None:
    """Exactly-once: writes its row, then (the file ``started`` written) hangs in its
    transaction, heedless of any cancellation."""
    import os

    Execution.objects.create(task_id=ctx.task_id, worker=f"pid={os.getpid()} ",
                             attempt=ctx.attempt)
    open(started, "w").close()
    pause(3600)
