"""The worker: claim due tasks, run them in a fixed thread pool, record their outcome.

One ``Worker`` is one process's worth of work (``--processes`` runs several under
:mod:`django_pgtasks.supervisor`). Its loop::

    while not stopping:
        wait for a free slot
        claim up to <free slots> tasks            (one short transaction)
        hand each to the pool                     (handler, then completion transaction)
        nothing claimed? sleep until woken        (NOTIFY, a free slot; POLL_INTERVAL as the
                                                   safety net; no transaction open while idle)

No transaction ever spans more than one claim or one completion, so an idle or busy worker
never pins the xmin horizon.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connections,
    transaction,
)

from . import maintenance, retention, scheduling  # noqa: F401 (importing registers their jobs)
from .completion import Completer
from .conf import pgtasks_settings
from .exceptions import (
    LeaseLostError,
    PgTasksError,
    Snooze,
    TaskCancelled,
    UnknownTaskError,
)
from .listener import Listener
from .liveness import Liveness
from .models import Status, Task
from .registry import TaskHandler, cancel_signal, get_handler
from .signals import task_finished, task_started

logger = logging.getLogger("django_pgtasks.worker")

#: Most successes recorded by one batched UPDATE.
COMPLETION_BATCH = 500
#: Seconds past an async handler's own timeout before the pool gives up on its thread.
ASYNC_CANCEL_MARGIN = 5.0
#: Which of the given running tasks of a worker were asked to stop (heartbeat safety net).
CANCEL_REQUESTS_SQL = (
    "SELECT id FROM pgtasks_task WHERE id = ANY(%s) AND status = 'RUNNING' "
    "AND locked_by = %s AND cancel_requested"
)


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs tasks from ``queues`` with ``concurrency`` threads until stopped.

    ``burst=True`` returns as soon as no task is due and none is running (for tests, cron
    and CI). Every other argument defaults to the matching ``PGTASKS`` setting.
    """

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        worker_id: str | None = None,
        burst: bool = False,
        poll_interval: float | None = None,
        task_pause: float | None = None,
        shutdown_grace: float | None = None,
        using: str | None = None,
        parent_pid: int | None = None,
        prefetch: int | None = None,
    ) -> None:
        s = pgtasks_settings
        self.queues = list(queues) if queues else s.queue_names
        self.concurrency = concurrency or s.CONCURRENCY
        self.worker_id = worker_id or default_worker_id()
        self.burst = burst
        self.poll_interval = s.POLL_INTERVAL if poll_interval is None else poll_interval
        self.task_pause = s.TASK_PAUSE if task_pause is None else task_pause
        self.shutdown_grace = s.SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace
        self.using = using or s.DATABASE
        self.parent_pid = parent_pid
        self.prefetch = s.PREFETCH if prefetch is None else prefetch
        self.completer: Completer | None = None
        self._stop = threading.Event()
        self._force = threading.Event()
        self._error_pause = s.ERROR_PAUSE
        self._pool: ThreadPool | None = None
        self._wakeup = threading.Event()
        self.listener: Listener | None = None
        self._exit_code = 0
        self._check_orphans = False
        self._next_heartbeat = 0.0
        self._next_poll = 0.0
        self._next_job: dict[str, float] = {}
        self.liveness = Liveness(self.worker_id, self.queues, self.concurrency, self.using)
        self.processed = 0

    # -- the loop --------------------------------------------------------------------------

    def run(self, install_signals: bool = True) -> int:
        """Work until stopped (or, in burst mode, until idle). Returns a process exit code."""
        if install_signals:
            self._install_signal_handlers()
        logger.info(
            "Worker %s started: queues=%s concurrency=%d burst=%s",
            self.worker_id, ",".join(self.queues), self.concurrency, self.burst,
        )
        pool = self._pool = ThreadPool(self.concurrency, self._execute, self._wakeup)
        if pgtasks_settings.COMPLETION_WINDOW > 0:
            self.completer = Completer(
                self.using, pgtasks_settings.COMPLETION_WINDOW, COMPLETION_BATCH,
                pgtasks_settings.ERROR_PAUSE, pgtasks_settings.ERROR_PAUSE_MAX, self._force,
            )
        listener = None
        if pgtasks_settings.LISTEN:
            listener = self.listener = Listener(
                self.using, self.queues, self._wakeup, worker_id=self.worker_id,
                on_cancel=self._stop_task,
            )
            listener.start()
        try:
            look = True  # is there reason to claim? (start-up, a wake-up, a full last claim)
            while not self._stop.is_set():
                self._maintain(pool)
                busy = pool.busy  # sampled before the claim, see the burst check below
                # Claim when a thread is free; with prefetch, once the prefetched tasks have
                # all started, and then enough to fill the threads and the prefetch again.
                full = busy >= self.concurrency + (1 if self.prefetch else 0)
                if full or not (look or self._poll_due()):
                    # Until woken (new work, a free slot), the next poll, or maintenance.
                    look = self._sleep(self._idle_timeout()) or look
                    continue
                wanted = self.concurrency + self.prefetch - busy
                tasks = self._claim(wanted)
                if tasks is None:  # database error: paused already, try again
                    continue
                self._next_poll = time.monotonic() + self.poll_interval
                # A rate limit (or a full concurrency key) held tasks back: look again as soon
                # as it may allow more (django_pgtasks.claiming).
                retry_in = getattr(tasks, "retry_in", None)
                if retry_in is not None:
                    self._next_poll = min(self._next_poll, time.monotonic() + retry_in)
                for task in tasks:
                    pool.submit(task, self._time_limit(task))
                look = len(tasks) == wanted  # a full claim: there may be more waiting
                if tasks:
                    continue
                # Idle only if nothing ran when the claim began: a task finishing during the
                # claim may have just made itself due again (a retry), after its snapshot.
                if not busy and self.burst and retry_in is None:
                    break
                if listener is not None:
                    listener.claimed_all_due()
            code = max(self._shutdown(pool), self._exit_code)
        finally:
            if self.completer is not None:
                self.completer.close(timeout=60)
            if listener is not None:
                listener.stop()
            self.liveness.unregister()
            connections[self.using].close()
        logger.info("Worker %s stopped after %d task(s).", self.worker_id, self.processed)
        return code

    def stop(self) -> None:
        """Ask the worker to stop claiming and finish what it runs (thread-safe)."""
        self._stop.set()
        self._wakeup.set()

    def _sleep(self, timeout: float) -> bool:
        """Wait until woken (new work, a free slot, a stop request) or ``timeout`` passes;
        ``True`` if woken."""
        woken = self._wakeup.wait(timeout)
        self._wakeup.clear()
        return woken

    def _poll_due(self) -> bool:
        """Time for the safety-net poll, or for a delayed task the listener heard of."""
        if time.monotonic() >= self._next_poll:
            return True
        due = self.listener.seconds_until_due() if self.listener is not None else None
        return due is not None and due <= 0

    def _idle_timeout(self) -> float:
        """How long the loop may sleep: the poll interval, cut short by the next heartbeat or
        rescue pass, and by the earliest delayed task the listener heard of."""
        now = time.monotonic()
        timeout = min(self._next_poll - now, self._next_heartbeat - now,
                      *(when - now for when in self._next_job.values()))
        if self.listener is not None and (due := self.listener.seconds_until_due()) is not None:
            timeout = min(timeout, due)
        return max(timeout, 0.001)

    # -- steps -----------------------------------------------------------------------------

    def _maintain(self, pool: ThreadPool) -> None:
        """Between claims: heartbeat, maintenance jobs (rescue, ...), time limits, supervisor."""
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self.liveness.heartbeat()
            self._next_heartbeat = now + pgtasks_settings.HEARTBEAT_INTERVAL
            if pool.busy:
                self._look_for_cancellations(pool)
        for job in maintenance.jobs():
            if now < self._next_job.get(job.name, 0.0):
                continue
            interval = job.interval()
            if not interval:
                self._next_job.pop(job.name, None)
                continue
            self._next_job[job.name] = now + interval
            try:
                job.run(self.using)
            except (DatabaseError, InterfaceError) as exc:
                logger.error("Maintenance job %s failed: %s", job.name, exc)
                _close_connection(self.using)
        for task, limit in pool.overdue():
            self._time_out(pool, task, limit)
        if self._check_orphans:
            self._give_back_orphans(pool)
        self._check_parent()

    def _stop_task(self, pk: int) -> None:
        """Ask the handler running task ``pk`` to stop (thread-safe; unknown ids ignored)."""
        task = self._pool.get(pk) if self._pool is not None else None
        if task is not None and not cancel_signal(task).is_set():
            logger.info("Task id=%s name=%s was cancelled; asking its handler to stop.",
                        task.pk, task.name)
            cancel_signal(task).set()

    def _look_for_cancellations(self, pool: ThreadPool) -> None:
        """With each heartbeat: stop running tasks whose cancellation was requested (the
        safety net for a lost or never-sent ``NOTIFY``). A primary-key lookup of the tasks
        this worker runs, only while it runs some."""
        ids = [pk for pk in pool.ids()
               if (task := pool.get(pk)) is not None and not cancel_signal(task).is_set()]
        if not ids:
            return
        try:
            with connections[self.using].cursor() as cursor:
                cursor.execute(CANCEL_REQUESTS_SQL, [ids, self.worker_id])
                requested = [row[0] for row in cursor.fetchall()]
        except (DatabaseError, InterfaceError) as exc:
            logger.error("Could not look for cancelled tasks: %s", exc)
            _close_connection(self.using)
            return
        for pk in requested:
            self._stop_task(pk)

    def _give_back_orphans(self, pool: ThreadPool) -> None:
        """After a failed claim, give back tasks it may have claimed all the same.

        A claim whose commit succeeded but whose reply was lost with the connection leaves
        tasks RUNNING under this (live) worker that it never received; no rescue would take
        them, since the worker is alive. They are the tasks the database says we hold and we
        do not know of. Giving them back is guarded, so a task that finished meanwhile is left
        alone.
        """
        try:
            held = list(Task.objects.using(self.using).held_by(self.worker_id))
            known = pool.ids() | (self.completer.pending_ids() if self.completer else set())
            orphans = [task for task in held if task.pk not in known]
            if orphans:
                count = Task.objects.unclaim(orphans, using=self.using)
                logger.warning("Worker %s gave back %d task(s) from a claim whose reply was "
                               "lost.", self.worker_id, count)
            self._check_orphans = False
        except (DatabaseError, InterfaceError) as exc:
            logger.error("Could not look for tasks of a lost claim: %s", exc)
            _close_connection(self.using)

    def _time_limit(self, task: Task) -> float | None:
        """Seconds the pool lets ``task`` run before it is failed and its slot freed."""
        try:
            handler = get_handler(task.name)
        except UnknownTaskError:
            return None
        if handler.timeout is None:
            return None
        # Async handlers cancel themselves at the limit; the pool only steps in if even the
        # cancellation hangs.
        return handler.timeout + (ASYNC_CANCEL_MARGIN if handler.is_async else 0.0)

    def _time_out(self, pool: ThreadPool, task: Task, limit: float) -> None:
        handler = get_handler(task.name)
        error = (
            f"django_pgtasks.exceptions.TaskTimeoutError: Task exceeded its time limit of "
            f"{limit:g}s; its thread could not be interrupted and was left to finish on its own "
            f"(its outcome will be ignored)."
        )
        try:
            Task.objects.mark_failed(task, error, retry_delay=handler.retry_delay(task.attempt),
                                     using=self.using)
        except (DatabaseError, InterfaceError) as exc:
            logger.error("Task id=%s: could not record its timeout: %s", task.pk, exc)
            _close_connection(self.using)
            return  # try again on the next pass
        pool.abandon(task)
        logger.warning("Task id=%s name=%s timed out after %gs; slot freed.", task.pk,
                       task.name, limit)
        if pool.stuck > self.concurrency:
            logger.error(
                "Worker %s has %d threads stuck in timed-out handlers; stopping so that the "
                "process (and those threads) can be replaced.", self.worker_id, pool.stuck,
            )
            self._exit_code = 1
            self.stop()

    def _claim(self, limit: int) -> list[Task] | None:
        try:
            tasks = Task.objects.claim(self.worker_id, self.queues, limit=limit, using=self.using)
        except (DatabaseError, InterfaceError) as exc:
            self._check_orphans = True  # the claim may have committed before the error
            self._database_error("claiming tasks", exc)
            return None
        self._error_pause = pgtasks_settings.ERROR_PAUSE
        return tasks

    def _execute(self, task: Task) -> None:
        """Run one claimed task in a pool thread and record its outcome (never raises)."""
        started = time.monotonic()
        logger.info(
            "Task id=%s name=%s queue=%s state=%s attempt=%d/%d",
            task.pk, task.name, task.queue, Status.RUNNING, task.attempt, task.max_attempts,
        )
        try:
            handler = get_handler(task.name)
        except PgTasksError as exc:
            self._record_failure(task, None, exc)
            self._finished(task, started, exc)
            return
        task.followups = []  # next pipeline stages, filled by TaskContext.then()
        if task.cancel_requested or cancel_signal(task).is_set():
            # Cancelled after the claim (e.g. while prefetched), or rescued after its
            # cancellation was requested: it never starts.
            try:
                self._record_cancel(task, TaskCancelled(
                    f"Task {task.pk} was cancelled before attempt {task.attempt} started."))
                self._finished(task, started, None)
            finally:
                self._after_task()
            return
        try:
            task_started.send(sender=Task, task=task, worker_id=self.worker_id)
            handler.started(task, self.worker_id)
            if handler.atomic:
                self._run_atomic(task, handler, started)
            else:
                self._run(task, handler, started)
        finally:
            self._after_task()

    def _finished(self, task: Task, started: float, exception: BaseException | None) -> None:
        """Log the outcome and send ``task_finished`` (once it is recorded)."""
        duration = time.monotonic() - started
        logger.info(
            "Task id=%s name=%s queue=%s state=%s attempt=%d/%d duration=%.3fs%s",
            task.pk, task.name, task.queue, task.status, task.attempt, task.max_attempts,
            duration, f" error={type(exception).__name__}" if exception else "",
        )
        self.processed += 1
        task_finished.send(
            sender=Task, task=task, worker_id=self.worker_id, status=task.status,
            duration=duration, exception=exception,
        )

    def _run(self, task: Task, handler: TaskHandler, started: float) -> None:
        """At-least-once mode: the handler, then the completion (batched or on its own)."""
        try:
            result = self._call(handler, task)
        except BaseException as exc:  # SystemExit/KeyboardInterrupt from a handler: a failure
            self._record_exception(task, handler, exc)
            handler.finished(task, self.worker_id, exc)
            self._finished(task, started, exc)
            return

        def done(recorded: bool) -> None:
            if recorded:
                task.status, task.result = Status.SUCCESSFUL, result
            handler.finished(task, self.worker_id, None)
            self._finished(task, started, None)

        if task.followups:
            # The next stages are inserted with this success, in one transaction.
            try:
                recorded = self._with_retries(
                    "recording success", task, lambda: self._succeed_with_followups(task, result))
            except DatabaseError as exc:  # refused, not unreachable: e.g. a constraint
                self._record_failure(task, handler, exc)
                handler.finished(task, self.worker_id, exc)
                self._finished(task, started, exc)
                return
            done(recorded)
        elif self.completer is not None:
            self.completer.add(task, result, done)
        else:
            done(self._with_retries("recording success", task, lambda: Task.objects
                                    .mark_succeeded(task, result, using=self.using)))

    def _succeed_with_followups(self, task: Task, result: Any) -> bool:
        with transaction.atomic(using=self.using):
            recorded = Task.objects.mark_succeeded(task, result, using=self.using)
            if recorded:
                _enqueue_followups(task.followups, self.using)
        return recorded

    def _run_atomic(self, task: Task, handler: TaskHandler, started: float) -> None:
        """Exactly-once mode: the handler's writes and the completion commit together."""
        try:
            with transaction.atomic(using=self.using):
                result = self._call(handler, task)
                if not Task.objects.mark_succeeded(task, result, using=self.using):
                    raise LeaseLostError(f"Task {task.pk} is no longer held by this worker.")
                if task.followups:
                    _enqueue_followups(task.followups, self.using)
        except LeaseLostError as exc:
            handler.finished(task, self.worker_id, exc)
            self._finished(task, started, exc)
            return
        except BaseException as exc:  # SystemExit/KeyboardInterrupt from a handler: a failure
            self._record_exception(task, handler, exc)
            handler.finished(task, self.worker_id, exc)
            self._finished(task, started, exc)
            return
        task.status, task.result = Status.SUCCESSFUL, result
        handler.finished(task, self.worker_id, None)
        self._finished(task, started, None)

    def _call(self, handler: TaskHandler, task: Task) -> Any:
        """Run the handler for ``task`` (the hook the in-test runner wraps)."""
        return handler.call(task, self.worker_id)

    def _record_exception(self, task: Task, handler: TaskHandler, exc: BaseException) -> None:
        """Record how a handler that raised ended: cancelled (its cancellation was requested,
        or it raised ``TaskCancelled``), snoozed (``Snooze``), or failed."""
        if cancel_signal(task).is_set() or isinstance(exc, TaskCancelled):
            self._record_cancel(task, exc)
        elif isinstance(exc, Snooze):
            recorded = self._with_retries(
                "recording snooze", task,
                lambda: Task.objects.mark_snoozed(task, exc.seconds, using=self.using),
            )
            if recorded:
                task.status, task.attempt = Status.READY, max(task.attempt - 1, 0)
        else:
            self._record_failure(task, handler, exc)

    def _record_cancel(self, task: Task, exc: BaseException) -> None:
        error = format_exception(exc)
        recorded = self._with_retries(
            "recording cancellation", task,
            lambda: Task.objects.mark_cancelled(task, error, using=self.using),
        )
        if recorded:
            task.status, task.error_text = Status.CANCELLED, error

    def _record_failure(
        self, task: Task, handler: TaskHandler | None, exc: BaseException
    ) -> None:
        fatal = handler is None or handler.is_fatal(exc)
        delay = None if fatal else handler.retry_delay(task.attempt)
        error = format_exception(exc)
        recorded = self._with_retries(
            "recording failure", task,
            lambda: Task.objects.mark_failed(task, error, retry_delay=delay, using=self.using),
        )
        if recorded:
            retry = delay is not None and task.attempt < task.max_attempts
            task.status = Status.AWAITING_RETRY if retry else Status.FAILED
            task.error_text = error

    def _with_retries(self, what: str, task: Task, action: Any) -> bool:
        """Run a completion ``action``; while the database is unreachable, reconnect and retry.

        It keeps trying (pausing ERROR_PAUSE, doubling up to ERROR_PAUSE_MAX) for as long as
        the worker runs: giving up would leave a task RUNNING under a live worker, which no
        rescue would ever take back. If the task was rescued meanwhile, the guarded update
        simply reports that it is no longer ours.
        """
        pause = pgtasks_settings.ERROR_PAUSE
        tries = 0
        while True:
            tries += 1
            try:
                return bool(action())
            except (OperationalError, InterfaceError) as exc:  # the connection, not the data
                logger.warning("Task id=%s: database error while %s (try %d): %s",
                               task.pk, what, tries, exc)
                _close_connection(self.using)
            if self._force.wait(pause):
                logger.error("Task id=%s: exiting before %s could be recorded; the task will "
                             "be rescued.", task.pk, what)
                return False
            pause = min(pause * 2, pgtasks_settings.ERROR_PAUSE_MAX)

    def _after_task(self) -> None:
        # A handler may have broken its connection (or left a transaction open): reset it so
        # the next task in this thread starts clean. Healthy connections are kept for reuse.
        for conn in connections.all(initialized_only=True):
            if conn.in_atomic_block or (conn.errors_occurred and not conn.is_usable()):
                conn.close()
        if self.task_pause:
            self._stop.wait(self.task_pause)

    def _database_error(self, what: str, exc: BaseException) -> None:
        logger.error("Database error while %s: %s; retrying in %.1fs.", what, exc,
                     self._error_pause)
        _close_connection(self.using)
        self._stop.wait(self._error_pause)
        self._error_pause = min(self._error_pause * 2, pgtasks_settings.ERROR_PAUSE_MAX)

    def _check_parent(self) -> None:
        if self.parent_pid is not None and os.getppid() != self.parent_pid:
            logger.warning("Worker %s lost its supervisor; stopping.", self.worker_id)
            self.stop()

    # -- shutdown --------------------------------------------------------------------------

    def _install_signal_handlers(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            if self._stop.is_set():
                logger.warning("Second %s: exiting now.", signal.Signals(signum).name)
                self._force.set()
                self._wakeup.set()
            else:
                logger.info(
                    "%s received: finishing %d running task(s) (grace %.0fs); "
                    "send it again to exit at once.",
                    signal.Signals(signum).name, self._pool.busy if self._pool else 0,
                    self.shutdown_grace,
                )
                self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _shutdown(self, pool: ThreadPool) -> int:
        # Prefetched tasks that have not started go back at once, for other workers.
        waiting = pool.take_waiting()
        if waiting:
            try:
                Task.objects.unclaim(waiting, using=self.using)
                logger.info("Worker %s gave back %d prefetched task(s).", self.worker_id,
                            len(waiting))
            except (DatabaseError, InterfaceError) as exc:
                logger.error("Could not give back prefetched tasks: %s", exc)
        deadline = time.monotonic() + self.shutdown_grace
        while pool.busy and not self._force.is_set() and time.monotonic() < deadline:
            self._sleep(min(0.2, max(deadline - time.monotonic(), 0.01)))
        if not pool.busy:
            pool.shutdown()
            return 0
        # Tasks still running past the grace period: give them back for another attempt now,
        # rather than leaving them to the rescue of abandoned tasks, then exit without waiting
        # for their threads (Python cannot interrupt a running thread).
        unfinished = pool.running()
        for task in unfinished:
            try:
                Task.objects.release(task, "Worker shut down before the task finished.",
                                     using=self.using)
            except (DatabaseError, InterfaceError) as exc:
                logger.error("Could not release task id=%s: %s", task.pk, exc)
        logger.warning("Worker %s exiting with %d task(s) unfinished; they were released.",
                       self.worker_id, len(unfinished))
        return 1


@dataclass
class _Slot:
    task: Task
    limit: float | None
    thread: threading.Thread | None = None
    deadline: float | None = None


class ThreadPool:
    """A fixed set of threads that run ``target(task)`` for submitted tasks.

    Unlike ``concurrent.futures.ThreadPoolExecutor``: each thread closes its own database
    connections when the pool shuts down (Django connections belong to the thread that opened
    them); the pool knows which tasks run right now and since when, so it can enforce time
    limits; a thread stuck in a timed-out handler can be abandoned and replaced; and threads
    are daemons, so a forced exit never waits for a stuck handler.
    """

    def __init__(self, size: int, target: Callable[[Task], None],
                 slot_freed: threading.Event) -> None:
        self._target = target
        self._queue: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._running: dict[int, _Slot] = {}
        self._lock = threading.Lock()
        self._slot_freed = slot_freed
        self._active: set[threading.Thread] = set()
        self._abandoned: set[threading.Thread] = set()
        self._started = 0
        for _ in range(size):
            self._start_thread()

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._loop, name=f"pgtasks-{self._started}",
                                  daemon=True)
        self._started += 1
        self._active.add(thread)
        thread.start()

    @property
    def busy(self) -> int:
        """Tasks submitted and not finished (or abandoned) yet."""
        return len(self._running)

    @property
    def stuck(self) -> int:
        """Threads still running a handler whose task timed out."""
        with self._lock:
            return sum(1 for t in self._abandoned if t.is_alive())

    def get(self, pk: int) -> Task | None:
        """The submitted (not finished or abandoned) task with id ``pk``, if any."""
        with self._lock:
            slot = self._running.get(pk)
            return slot.task if slot is not None else None

    def running(self) -> list[Task]:
        with self._lock:
            return [slot.task for slot in self._running.values()]

    def ids(self) -> set[int]:
        """Ids of the tasks submitted and not finished (or abandoned) yet."""
        with self._lock:
            return set(self._running)

    def submit(self, task: Task, limit: float | None = None) -> None:
        with self._lock:
            self._running[task.pk] = _Slot(task, limit)
        self._queue.put(task)

    def take_waiting(self) -> list[Task]:
        """Remove and return the submitted tasks no thread has started yet."""
        taken = []
        with self._lock:
            while True:
                try:
                    task = self._queue.get_nowait()
                except queue.Empty:
                    break
                if task is not None:
                    self._running.pop(task.pk, None)
                    taken.append(task)
        return taken

    def overdue(self) -> list[tuple[Task, float]]:
        now = time.monotonic()
        with self._lock:
            return [(slot.task, slot.limit) for slot in self._running.values()
                    if slot.deadline is not None and now > slot.deadline]

    def abandon(self, task: Task) -> None:
        """Give up on a timed-out task: free its slot and replace the thread running it."""
        with self._lock:
            slot = self._running.pop(task.pk, None)
            if slot is None or slot.thread is None:
                return
            self._active.discard(slot.thread)
            self._abandoned.add(slot.thread)
            self._start_thread()
        self._slot_freed.set()

    def shutdown(self) -> None:
        with self._lock:
            active = list(self._active)
        for _ in active:
            self._queue.put(None)
        for thread in active:
            thread.join()

    def _loop(self) -> None:
        me = threading.current_thread()
        try:
            while (task := self._queue.get()) is not None:
                with self._lock:
                    slot = self._running.get(task.pk)
                    if slot is not None:
                        slot.thread = me
                        if slot.limit is not None:
                            slot.deadline = time.monotonic() + slot.limit
                try:
                    self._target(task)
                except BaseException:  # keep the thread (and its slot) alive whatever happens
                    logger.exception("Internal error while running task id=%s.", task.pk)
                with self._lock:
                    abandoned = me in self._abandoned
                    if abandoned:
                        self._abandoned.discard(me)
                    elif self._running.get(task.pk) is slot:
                        # Only this run's slot: once its outcome is recorded, the same task
                        # may already be claimed again (a retry due at once) and submitted
                        # under the same id.
                        del self._running[task.pk]
                if abandoned:  # timed out: a replacement thread has taken over the slot
                    return
                self._slot_freed.set()
        finally:
            connections.close_all()


def format_exception(exc: BaseException) -> str:
    """``Type: message``, a blank line, then the traceback.

    The type and message come first so they survive truncation and group well; an exception
    whose ``__str__`` fails is still recorded (the traceback module substitutes a marker).
    """
    try:
        header = "".join(traceback.format_exception_only(exc)).strip()
        return f"{header}\n\n{''.join(traceback.format_exception(exc))}"
    except Exception:
        return f"{type(exc).__module__}.{type(exc).__qualname__}: <unprintable exception>"


def _enqueue_followups(tasks: list[Task], using: str) -> None:
    """Insert a pipeline's next stages. Those on the finishing task's database commit with its
    completion; a stage whose queue is on another database (``PGTASKS["QUEUES"]``) is
    written there, in that database's own transaction."""
    from .routing import queues_on

    # A database that holds no configured queue gets every stage (tasks put there by hand).
    Task.objects.enqueue_many(tasks, using=None if queues_on(using) else using)


def _close_connection(alias: str) -> None:
    with contextlib.suppress(DatabaseError, InterfaceError):
        connections[alias].close()
