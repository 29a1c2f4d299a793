"""The process pool: each task runs in a child process, one task at a time per child.

The worker keeps everything but the handlers: claims, liveness, the recording of outcomes,
the callbacks and its own connections stay in the worker process. ``--concurrency`` children,
forked from the warmed-up worker through its fork server (:mod:`.forkserver`), run the
handlers. What that buys over the thread pool:

- a time limit (``@pgtask(timeout=...)``) really stops the handler: at the limit the child
  gets ``SIGTERM``, and ``SIGKILL`` :data:`KILL_GRACE` seconds later if it is still there;
  the attempt ends with ``TaskTimeoutError`` only once the child is gone, so the next attempt
  of that task can never start while the last one still runs;
- a cancelled task stops even if its handler ignores the request: a child still running it
  ``cancel_grace`` seconds (``PGTASKS["CANCEL_GRACE"]``) after the worker learnt of the
  cancellation is stopped the same way, and the task ends ``CANCELLED``;
- a child that dies (a crash in native code, ``os._exit()``, the out-of-memory killer) takes
  its task with it, never the worker: the run ends as an interruption naming the signal or
  the exit code (within ``MAX_INTERRUPTIONS``), and a new child takes the slot;
- ``max_tasks_per_child`` and ``max_memory_per_child`` (resident memory after a task) replace
  a child between two tasks, so a leak is bounded.

Who owns what:

- :class:`ProcessPool` (in the worker) owns the slots: one thread per child, which sends the
  task to its child, waits for the report until the task's time limit (or the cancellation's
  grace), stops a child that overran it or notices one that died, has the run's outcome
  recorded through the executor
  (:meth:`~django_pgtasks.worker.executor.Executor.ended_elsewhere`: the loop records it with
  the others, and the callbacks then run in the worker) and replaces a child when its limits
  say so.
- Each child (:func:`child_main`) owns its database connections, opened after the fork (it
  never uses one it inherited), and runs the executor's :meth:`~.Executor.run` through
  :class:`ChildExecutor`, which sends the run's milestones to the worker instead of
  recording them; an ``atomic=True`` handler's outcome is recorded in the child, inside the
  handler's transaction, as on a pool thread, so it stays exactly-once.

Where the callbacks run: ``task_started``, the handler's ``started()`` and ``finished()``,
``task_finished`` and the outcome's log line run in the worker (the signals are the worker's,
and so are its metrics); ``started()`` runs when the child reports that the handler starts,
while it runs. The run's tracing span is opened and ended in the worker; spans a handler
makes in its child are not children of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING, Any

from django.db import connections

from django_pgtasks.definition.error_text import qualified_name, reason_text
from django_pgtasks.definition.registry import (
    TaskHandler,
    cancel_signal,
    cancel_was_signalled,
    get_handler,
)
from django_pgtasks.exceptions import (
    ChildProcessDied,
    PgTasksError,
    TaskCancelled,
    TaskTimeoutError,
)
from django_pgtasks.lifecycle.recorder import Recorder
from django_pgtasks.lifecycle.transitions import (
    Cancelled,
    Failed,
    Interrupted,
    Outcome,
    Unstarted,
)
from django_pgtasks.worker.executor import Executor, RunReport, retry_after
from django_pgtasks.worker.pools.forkserver import (
    ForkServer,
    ForkServerLost,
    describe_exit,
)
from django_pgtasks.worker.pools.slots import Run, SlotPool
from django_pgtasks.worker.tracing import leave, start_run

if TYPE_CHECKING:
    from django_pgtasks.worker.pools import PoolOptions

logger = logging.getLogger("django_pgtasks.worker")

#: A claimed task as the pool sees it.
Task = Any

#: Seconds between the ``SIGTERM`` of a child over its time limit and its ``SIGKILL``.
KILL_GRACE = 5.0
#: Seconds a child told to exit (replaced, or the pool shutting down) has before ``SIGKILL``.
EXIT_GRACE = 10.0
#: Seconds to wait for the fork server's report of a child whose socket closed.
DEATH_REPORT_WAIT = 5.0


class _Stopped(Enum):
    """Why a slot stopped waiting for its child's report of a run."""

    #: The task's time limit passed.
    TIME_LIMIT = "time limit"
    #: The task's cancellation was requested, and its grace passed.
    CANCELLED = "cancelled"


class _Waker:
    """Wakes a slot's thread while it waits for its child's report (a cancellation came in):
    one end of a socket pair is waited on beside the child's socket, the other written to."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)

    def fileno(self) -> int:
        return self._reader.fileno()

    def wake(self) -> None:
        with contextlib.suppress(OSError):  # full: it is awake already
            self._writer.send(b"!")

    def clear(self) -> None:
        with contextlib.suppress(OSError):
            while self._reader.recv(4096):
                pass

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


class _Child:
    """The worker's side of one child: its pid, its socket, what it ran."""

    def __init__(self, pid: int, channel: socket.socket) -> None:
        self.pid = pid
        self.connection = Connection(channel.detach())
        self.tasks = 0
        #: Its resident memory after its last task, in bytes.
        self.rss = 0
        self._lock = threading.Lock()

    def send(self, message: tuple) -> None:
        with self._lock:
            self.connection.send(message)

    def send_quietly(self, message: tuple) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.send(message)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.close()


class ProcessPool(SlotPool):
    """``size`` child processes, each running one task at a time (see the module docstring).

    It has the interface of :class:`~.threads.ThreadPool` (:class:`~.Pool`). It enforces the
    time limits itself, so :meth:`overdue` is always empty and nothing is ever
    :attr:`stuck`. ``stop(exit_code)`` stops the worker if the fork server dies (no child can
    be started any more: the worker exits 1, to be replaced).
    """

    def __init__(self, options: PoolOptions, executor: Executor, slot_freed: threading.Event,
                 on_crash: Callable[[Task, BaseException], None] | None = None,
                 stop: Callable[[int], None] | None = None) -> None:
        super().__init__(slot_freed)
        self._executor = executor
        self._size = options.size
        self._max_tasks = options.max_tasks_per_child
        self._max_memory = (None if options.max_memory_per_child is None
                            else options.max_memory_per_child * 1024 * 1024)
        self._cancel_grace = options.cancel_grace
        self._on_crash = on_crash
        self._stop_worker = stop or (lambda code: None)
        #: Set by :meth:`terminate`: the children are being killed, their runs are the
        #: worker's to record (as interrupted by the shutdown).
        self._terminating = threading.Event()
        config = ChildConfig(using=executor.using, worker_id=executor.worker_id,
                             concurrency=options.size)
        self._forkserver = ForkServer(lambda channel: child_main(channel, config),
                                      on_lost=self._forkserver_lost)
        self._slots = [threading.Thread(target=self._slot, name=f"pgtasks-child-{i}",
                                        daemon=True) for i in range(options.size)]
        for slot in self._slots:
            slot.start()

    # -- the Pool interface ------------------------------------------------------------------

    @property
    def stuck(self) -> int:
        """Always 0: a child over its time limit is killed, never left running."""
        return 0

    def overdue(self) -> list[tuple[Task, float]]:
        """Always empty: the pool stops the children over their time limit itself."""
        return []

    def abandon(self, task: Task) -> None:
        """Nothing to abandon: a child over its time limit is killed."""

    def shutdown(self) -> None:
        """Once the queued tasks ran: let every child exit, then stop the fork server."""
        self._closing.set()
        self._end_slots(len(self._slots))
        for slot in self._slots:
            slot.join()
        self._forkserver.close()

    def terminate(self) -> None:
        """Past the worker's shutdown grace: kill every child now (``SIGKILL``) and wait until
        each is gone, then stop the fork server. The runs they had are left for the worker to
        record (interrupted by the shutdown)."""
        self._terminating.set()
        self._closing.set()
        self._forkserver.close()  # which kills every child, and returns once they are gone
        self._end_slots(len(self._slots))

    # -- the slots -------------------------------------------------------------------------

    def _slot(self) -> None:
        """One slot's thread: keep a child ready, run each task taken in it."""
        child: _Child | None = None
        waker = _Waker()
        try:
            while True:
                if child is None and not self._closing.is_set():
                    child = self._spawn()
                run = self._next()
                if run is None:
                    break
                child = self._run_in(child, run, waker)
                rest = self._finished(run)
                if child is not None and self._worn_out(child):
                    self._retire(child)
                    child = None
                if rest:
                    self._rest_for(rest)
                elif self._executor.task_pause:
                    self._closing.wait(self._executor.task_pause)
        except BaseException:
            logger.exception("Internal error in a slot of the process pool.")
            raise
        finally:
            if child is not None and not self._terminating.is_set():
                self._retire(child)
            waker.close()
            connections.close_all()  # the slot's own, if it recorded an outcome itself

    def _spawn(self) -> _Child | None:
        if self._terminating.is_set():
            return None
        try:
            pid, channel = self._forkserver.spawn()
        except ForkServerLost:
            return None
        return _Child(pid, channel)

    def _run_in(self, child: _Child | None, run: Run, waker: _Waker) -> _Child | None:
        """Run ``run``'s task in ``child`` (or a new child, if it is gone); return the child
        to use next (``None``: it is gone). ``waker`` wakes the wait for the report when the
        task's cancellation comes in."""
        task = run.task
        token = start_run(task, self._executor.worker_id)  # the span, in the worker
        if token is not None:
            leave(token)
        message = ("run", _fields(task), task.pk)
        for _ in range(2):  # a child that died while idle never got the task: another one
            if child is None:
                child = self._spawn()
            if child is None:  # no child can be started (the fork server is gone)
                self._ended(task, RunReport(outcome=Unstarted("no child process could be "
                                                              "started"), quiet=True))
                return None
            try:
                child.send(message)
                break
            except (OSError, ValueError):
                self._gone(child, None)
                child = None
        else:
            self._ended(task, RunReport(outcome=Unstarted("its child process died before it "
                                                          "got the task"), quiet=True))
            return None
        began = time.monotonic()
        deadline = None if run.limit is None else began + run.limit

        def cancelled() -> None:  # on the thread that learnt of the cancellation
            child.send_quietly(("cancel", task.pk))
            waker.wake()

        remove = cancel_signal(task).add_callback(cancelled)
        try:
            report = self._wait_for_report(child, task, deadline, waker)
        finally:
            remove()
        if isinstance(report, _Stopped):  # over its time limit, or its cancellation's grace
            how = self._stop(child)
            late = late_report(child)
            self._gone(child, None)
            if self._terminating.is_set():
                return None
            if late is not None:  # it ended on its own as it was being stopped
                self._ended(task, late[0])
            elif report is _Stopped.TIME_LIMIT:
                self._timed_out(task, run.limit or 0.0, time.monotonic() - began, child.pid,
                                how)
            else:
                self._stopped_cancelled(task, time.monotonic() - began, child.pid, how)
            return None
        if isinstance(report, int):  # the child died: its wait status
            self._gone(child, report)
            if not self._terminating.is_set():
                self._died(task, child.pid, report, time.monotonic() - began)
            return None
        report, rss = report
        child.tasks += 1
        child.rss = rss
        if report.rest:
            self._rest.seconds = report.rest
        self._ended(task, report)
        return child

    def _wait_for_report(self, child: _Child, task: Task, deadline: float | None,
                         waker: _Waker) -> tuple[RunReport, int] | int | _Stopped:
        """The child's report of the run (with its resident memory), its wait status if it
        died, or why the wait ended first: ``deadline`` passed, or the cancellation's grace
        did (:attr:`_cancel_grace` seconds after ``waker`` woke the wait).

        The grace starts only once ``task``'s own cancellation signal is set: a wake-up left
        over from the slot's last run (its signal's callbacks run outside the signal's lock,
        so one can come after the run ended) only wakes the wait."""
        handler = _handler_or_none(task.name)
        cancel_by: float | None = None
        while True:
            ends = [end for end in (deadline, cancel_by) if end is not None]
            timeout = None if not ends else max(min(ends) - time.monotonic(), 0.0)
            try:
                ready = wait([child.connection, waker], timeout)
                if not ready:
                    return (_Stopped.CANCELLED if cancel_by is not None
                            and (deadline is None or cancel_by <= deadline)
                            else _Stopped.TIME_LIMIT)
                if waker in ready:
                    waker.clear()
                    if (cancel_by is None and self._cancel_grace is not None
                            and cancel_was_signalled(task)):
                        cancel_by = time.monotonic() + self._cancel_grace
                    if child.connection not in ready:
                        continue
                message = child.connection.recv()
            except (EOFError, OSError):
                return self._exit_status(child)
            if message[0] == "started":
                if handler is not None:
                    try:
                        self._executor.announce(task, handler)
                    except Exception:
                        logger.exception("Task id=%s: error in task_started or the handler's "
                                         "started().", task.pk)
            elif message[0] == "ended":
                return message[1], message[2]

    def _exit_status(self, child: _Child) -> int:
        """The wait status of a child whose socket closed (it died, or is about to)."""
        status = self._forkserver.wait(child.pid, DEATH_REPORT_WAIT)
        if status is None:  # its socket closed, but it lives on: it must not
            self._forkserver.signal(child.pid, signal.SIGKILL)
            status = self._wait_gone(child)
        return status

    def _stop(self, child: _Child) -> str:
        """Stop a child over its time limit: ``SIGTERM``, ``SIGKILL`` after
        :data:`KILL_GRACE`; return once it is gone, saying how it was stopped."""
        self._forkserver.signal(child.pid, signal.SIGTERM)
        status = self._forkserver.wait(child.pid, KILL_GRACE)
        if status is not None:
            return f"with SIGTERM ({describe_exit(status).replace('was ', '')})"
        self._forkserver.signal(child.pid, signal.SIGKILL)
        self._wait_gone(child)
        return f"with SIGKILL, {KILL_GRACE:g}s after a SIGTERM it did not end on"

    def _wait_gone(self, child: _Child) -> int:
        """Wait (for ever, warning now and then) until ``child`` has exited: until then its
        slot runs nothing, and its task's outcome is not recorded."""
        while (status := self._forkserver.wait(child.pid, 30.0)) is None:
            logger.warning("Child process %s of the process pool still runs after SIGKILL; "
                           "waiting for it.", child.pid)
        return status

    def _gone(self, child: _Child, status: int | None) -> None:
        """Forget a child that has exited."""
        child.close()
        self._forkserver.forget(child.pid)
        if status is not None and status != 0:
            logger.info("Child process %s of the process pool %s.", child.pid,
                        describe_exit(status))

    def _timed_out(self, task: Task, limit: float, duration: float, pid: int,
                   how: str) -> None:
        handler = _handler_or_none(task.name)
        message = (f"Task exceeded its time limit of {limit:g}s; its child process {pid} "
                   f"was stopped {how}.")
        logger.warning("Task id=%s name=%s timed out after %gs; child process %s stopped %s.",
                       task.pk, task.name, limit, pid, how)
        error = reason_text(TaskTimeoutError, message)
        if cancel_was_signalled(task):  # a failure after a cancellation ends the task
            outcome: Outcome = Cancelled(error)
        else:
            outcome = Failed(error, None if handler is None else retry_after(handler, task, None))
        self._ended(task, RunReport(outcome=outcome, duration=duration,
                                    error=TaskTimeoutError(message)))

    def _stopped_cancelled(self, task: Task, duration: float, pid: int, how: str) -> None:
        grace = self._cancel_grace or 0.0
        message = (f"Task {task.pk} was cancelled while it ran; its handler was still running "
                   f"{grace:g}s after the request (CANCEL_GRACE), and its child process {pid} "
                   f"was stopped {how}.")
        logger.warning("Task id=%s name=%s was cancelled and still ran %gs later; child "
                       "process %s stopped %s.", task.pk, task.name, grace, pid, how)
        self._ended(task, RunReport(outcome=Cancelled(reason_text(TaskCancelled, message)),
                                    duration=duration, error=TaskCancelled(message)))

    def _died(self, task: Task, pid: int, status: int, duration: float) -> None:
        message = (f"The child process {pid} running the task {describe_exit(status)} before "
                   f"the run ended.")
        logger.warning("Task id=%s name=%s: child process %s %s while running it.", task.pk,
                       task.name, pid, describe_exit(status))
        self._ended(task, RunReport(outcome=Interrupted(reason_text(ChildProcessDied,
                                                                    message)),
                                    duration=duration, error=ChildProcessDied(message)))

    def _ended(self, task: Task, report: RunReport) -> None:
        try:
            self._executor.ended_elsewhere(task, report)
        except BaseException as exc:
            logger.exception("Internal error while ending task id=%s.", task.pk)
            if self._on_crash is not None:
                try:  # the task must not stay RUNNING under a live worker
                    self._on_crash(task, exc)
                except BaseException:
                    logger.exception("Task id=%s: the internal error could not be recorded; "
                                     "the task waits for the rescue.", task.pk)

    def _worn_out(self, child: _Child) -> bool:
        """Whether ``child`` is to be replaced now (after its last task)."""
        if self._max_tasks is not None and child.tasks >= self._max_tasks:
            logger.info("Replacing child process %s of the process pool after %d task(s) "
                        "(max_tasks_per_child).", child.pid, child.tasks)
            return True
        rss = child.rss
        if self._max_memory is not None and rss > self._max_memory:
            logger.info("Replacing child process %s of the process pool: %d MiB resident "
                        "after its last task (max_memory_per_child %d MiB).", child.pid,
                        rss // (1024 * 1024), self._max_memory // (1024 * 1024))
            return True
        return False

    def _retire(self, child: _Child) -> None:
        """Let an idle child exit (``SIGKILL`` after :data:`EXIT_GRACE`); wait until it is
        gone."""
        child.send_quietly(("exit",))
        status = self._forkserver.wait(child.pid, EXIT_GRACE)
        if status is None:
            self._forkserver.signal(child.pid, signal.SIGKILL)
            status = self._forkserver.wait(child.pid, EXIT_GRACE)
        self._gone(child, status)

    def _forkserver_lost(self) -> None:
        if self._closing.is_set():
            return
        logger.critical("The process pool's fork server died: no child process can be "
                        "started any more; the worker stops, to be replaced.")
        self._stop_worker(1)


def late_report(child: _Child) -> tuple[RunReport, int] | None:
    """The report of a run that ended as its ``child`` was being stopped, if the child sent
    it before it went (an ``atomic=True`` handler's outcome is then recorded already)."""
    with contextlib.suppress(EOFError, OSError):
        while child.connection.poll(0):
            message = child.connection.recv()
            if message[0] == "ended":
                return message[1], message[2]
    return None


# -- the child's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class ChildConfig:
    """What a child needs to know of its worker."""

    using: str
    worker_id: str
    concurrency: int


class ChildExecutor(Executor):
    """The executor as a child of the process pool runs it: the handler and, for an
    ``atomic=True`` handler (or a pipeline's next stages), the recording in its transaction;
    every other milestone of the run (it starts, its outcome, its recorded status) is kept in
    :attr:`report` for the worker, which records and runs the callbacks."""

    def __init__(self, config: ChildConfig, send: Callable[[tuple], None]) -> None:
        super().__init__(using=config.using, worker_id=config.worker_id,
                         recorder=Recorder(config.using), hand_in=self._hand_in_quietly,
                         batched=True, concurrency=config.concurrency, rest=self._rested,
                         ran=self._ran_for)
        self._send = send
        #: How the current run ended, for the worker.
        self.report = RunReport()

    def announce(self, task: Task, handler: TaskHandler) -> None:
        self._send(("started",))

    def end(self, task: Task, handler: TaskHandler | None, duration: float, outcome: Outcome,
            exc: BaseException | None) -> None:
        self.report.outcome = outcome
        self.report.duration = duration
        self.report.error = _portable(exc)

    def finish(self, task: Task, handler: TaskHandler | None, duration: float,
               status: str | None, outcome: Outcome | None,
               exc: BaseException | None) -> None:
        self.report.recorded = True
        self.report.status = status
        self.report.outcome = outcome
        self.report.duration = duration
        self.report.error = _portable(exc)

    def _hand_in_quietly(self, task: Task, outcome: Outcome, done: Any) -> None:
        self.report.outcome = outcome
        self.report.quiet = True

    def _rested(self, seconds: float) -> None:
        self.report.rest = seconds

    def _ran_for(self, seconds: float) -> None:
        self.report.ran = seconds


def child_main(channel: socket.socket, config: ChildConfig) -> None:
    """A child's life: run each task the worker sends, one at a time, and report how it
    ended; exit when told to, or when the worker is gone.

    A thread reads the worker's messages, so that a cancellation reaches the running handler
    (its :func:`~django_pgtasks.definition.registry.cancel_signal` is set)."""
    connection = Connection(channel.detach())
    # Nothing inherited is used: the fork server held no connection, but a worker running in
    # a thread of a bigger process (the tests) may have left other threads' wrappers.
    for conn in connections.all(initialized_only=True):
        conn.connection = None
    inbox: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
    current: dict[str, Any] = {}
    send_lock = threading.Lock()

    def send(message: tuple) -> None:
        with send_lock:
            connection.send(message)

    def read() -> None:
        try:
            while True:
                message = connection.recv()
                if message[0] == "run":
                    task = _rebuild(message[1])
                    current["task"] = task
                    inbox.put(task)
                elif message[0] == "cancel":
                    task = current.get("task")
                    if task is not None and task.pk == message[1]:
                        cancel_signal(task).set()
                elif message[0] == "exit":
                    break
        except (EOFError, OSError):
            pass
        inbox.put(None)

    threading.Thread(target=read, name="pgtasks-child-inbox", daemon=True).start()
    executor = ChildExecutor(config, send)
    while (task := inbox.get()) is not None:
        executor.report = RunReport()
        try:
            executor.run(task)
        except BaseException as exc:
            logger.exception("Internal error while running task id=%s.", task.pk)
            executor.crashed(task, exc)
        send(("ended", executor.report, _resident_memory()))
    connections.close_all()


def _fields(task: Task) -> tuple[str | None, list[Any]]:
    """What a child needs to rebuild ``task``: its database alias and its field values."""
    return task._state.db, [getattr(task, field.attname)
                            for field in task._meta.concrete_fields]


def _rebuild(fields: tuple[str | None, list[Any]]) -> Task:
    from django_pgtasks.models import Task as TaskModel

    db, values = fields
    return TaskModel.from_db(db, [f.attname for f in TaskModel._meta.concrete_fields], values)


def _portable(exc: BaseException | None) -> BaseException | None:
    """``exc`` as it can cross to the worker: itself if it pickles (its traceback, which
    does not, added as a note), else a :class:`ChildProcessError`-like stand-in naming it."""
    if exc is None:
        return None
    text = "".join(traceback.format_exception(exc))
    with contextlib.suppress(Exception):
        if not any("Traceback in the child process" in note
                   for note in getattr(exc, "__notes__", ())):
            exc.add_note(f"Traceback in the child process {os.getpid()}:\n{text}")
        copy = pickle.loads(pickle.dumps(exc))
        if type(copy) is type(exc):
            return copy
    return RemoteError(f"{qualified_name(type(exc))}: {exc}\n\n{text}")


class RemoteError(Exception):
    """A handler's exception that could not cross from its child process to the worker: its
    type, message and traceback, as text."""


def _resident_memory() -> int:
    """This process's resident memory, in bytes."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _handler_or_none(name: str) -> TaskHandler | None:
    try:
        return get_handler(name)
    except PgTasksError:
        return None
