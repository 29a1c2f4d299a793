"""The worker: claim due tasks, run them in a fixed thread pool, record their outcome.

One ``Worker`` is one process's worth of work (``--processes`` runs several under
:mod:`django_pgtasks.worker.supervisor`). Its loop::

    while not stopping:
        wait for a free slot
        claim up to <free slots> tasks            (one short transaction)
        hand each to the pool                     (handler, then completion transaction)
        nothing claimed? sleep until woken        (NOTIFY, a free slot; POLL_INTERVAL as the
                                                   safety net; no transaction open while idle)

No transaction ever spans more than one claim or one completion, so an idle or busy worker
never pins the xmin horizon. Nothing else runs on the loop's thread. The worker is composed of
parts that each own their state and talk to the loop through the callbacks they are given:
the executor (:mod:`~django_pgtasks.worker.executor`) runs a task on a pool thread, the
watchdog (:mod:`~django_pgtasks.worker.watchdog`) keeps the worker alive, the releaser
(:mod:`~django_pgtasks.worker.releaser`) releases workflow children and the maintainer
(:mod:`~django_pgtasks.worker.maintainer`) runs rescue, partitions, purge and scheduler, each
but the executor on a thread and session of its own.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import secrets
import signal
import socket
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.schema import is_missing_schema, not_migrated
from django_pgtasks.database.sessions import transaction_pooler
from django_pgtasks.database.sqlstates import is_connection_loss
from django_pgtasks.definition.error_text import format_exception, reason_text
from django_pgtasks.exceptions import NotMigratedError, WorkerShutdown
from django_pgtasks.lifecycle import release
from django_pgtasks.lifecycle.recorder import Recorder, close_connection
from django_pgtasks.models import Task
from django_pgtasks.telemetry import tracing
from django_pgtasks.worker.completion import Completion
from django_pgtasks.worker.executor import Executor, retry_after
from django_pgtasks.worker.listener import Listener
from django_pgtasks.worker.liveness import Liveness
from django_pgtasks.worker.maintainer import Maintainer
from django_pgtasks.worker.pools import Pool, PoolOptions, check_options, make_pool
from django_pgtasks.worker.pools.threads import ThreadPool
from django_pgtasks.worker.prefetch import Prefetch
from django_pgtasks.worker.releaser import Releaser
from django_pgtasks.worker.watchdog import Watchdog, time_limit

__all__ = ["ThreadPool", "Worker", "default_worker_id", "format_exception"]

logger = logging.getLogger("django_pgtasks.worker")

#: Longest pause between two claims while the database refuses connections: a worker resumes
#: within this time once the server is back.
RECONNECT_PAUSE_MAX = 2.0
#: Session settings of the loop's connection (claims, outcomes): a claim waiting on a lock
#: held elsewhere gives up instead of stalling the loop (liveness and maintenance run on
#: threads and connections of their own, so a stalled loop never looks like a lost worker
#: and a maintenance job waiting on a lock never holds up a claim).
#:
#: And no bitmap scans: the outcome statement of a large batch reads the running tasks'
#: index, where every run ended leaves a dead entry until a vacuum. A plain index scan marks
#: the dead entries it meets, so that the next statements skip them; a bitmap scan never
#: does, and each statement reads them all again (the planner takes one when the table has no
#: statistics, as after a fresh burst, or when the last ANALYZE saw many running tasks: the
#: server's CPU per task went from 56 to 78 us on a burst of 100,000).
#:
#: And a random page read costed as little more than a sequential one (1.1, against 4 by
#: default): the task table's hot pages are in memory. With 4, for the outcomes of a batch of
#: 100 to 256 runs (``BY_ID_AT_MOST``) on a live partition of 20,000 tasks, the planner read
#: the whole partition rather than look each id up in the primary key.
SESSION_SQL = ("SELECT set_config('lock_timeout', %s, false), "
               "set_config('statement_timeout', %s, false), "
               "set_config('enable_bitmapscan', 'off', false), "
               "set_config('random_page_cost', '1.1', false)")
LOCK_TIMEOUT = "5s"
STATEMENT_TIMEOUT = "5min"
#: The garbage collector's first threshold in a worker that owns its process (Python's default
#: is 700): how many more container objects must be alive than at the last pass before the
#: next. The tasks a claim brings in make hundreds of such objects that stay alive while they
#: run (each task's instance and JSON values, its run's state), so with 700 a worker of 2
#: processes x 32 threads ran a young collection every 50 tasks or so, at about 0.25 ms each:
#: 0.2 to 0.25 s of each process's CPU in a drain of 100,000 tasks, 4 to 5 us per task (timed
#: with gc.callbacks in one-off rounds). With 20,000 the same drain ran one. Garbage that only
#: the collector frees (reference cycles) waits a little longer, and it is still freed.
GC_THRESHOLD = 20_000
#: Longest wait at the end for the callbacks of recorded outcomes (their signals and log
#: lines) to run: a receiver that hangs never keeps the process from exiting.
CALLBACKS_STOP_WAIT = 5.0


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


class Worker:
    """Runs tasks from ``queues`` with ``concurrency`` threads until stopped.

    ``burst=True`` returns as soon as no task is due and none is running (for tests, cron
    and CI). Every other argument defaults to the matching ``PGTASKS`` setting.

    The worker owns the loop's state (what to claim and when, the outcomes handed in, the
    exit code) and holds its parts: :attr:`executor` (what the pool threads run),
    :attr:`watchdog`, :attr:`releaser` and :attr:`maintainer`. Each part owns its own state;
    the worker gives it callbacks, and calls only its public methods.
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
        prefetch: int | str | None = None,
        pool: str | None = None,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        cancel_grace: float | None = None,
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
        #: Where handlers run (threads, child processes, an event loop), and its limits.
        self.pool_options = PoolOptions(
            kind=pool or s.POOL, size=self.concurrency,
            max_tasks_per_child=(s.MAX_TASKS_PER_CHILD if max_tasks_per_child is None
                                 else max_tasks_per_child),
            max_memory_per_child=(s.MAX_MEMORY_PER_CHILD if max_memory_per_child is None
                                  else max_memory_per_child),
            cancel_grace=s.CANCEL_GRACE if cancel_grace is None else cancel_grace)
        problem = check_options(self.pool_options)
        if problem:
            raise ValueError(problem)
        #: How many tasks to claim: the free threads, and some beyond (a number, or "auto").
        self.prefetch = Prefetch(s.PREFETCH if prefetch is None else prefetch,
                                 self.concurrency, s.PREFETCH_HORIZON)
        self._stop = threading.Event()
        self._stopping = threading.Lock()
        self._force = threading.Event()
        #: The signals handed over by the handlers to the thread that acts on them (see
        #: _install_signal_handlers); ``None`` until installed.
        self._signals: queue.SimpleQueue[str | None] | None = None
        self._error_pause = s.ERROR_PAUSE
        self._pool: Pool | None = None
        self._wakeup = threading.Event()
        self._exit_code = 0
        self._check_orphans = False
        self._next_poll = 0.0
        #: The loop waits in :meth:`_sleep` (see :attr:`asleep`).
        self._asleep = False
        self._session: Any = None
        self.liveness = Liveness(self.worker_id, self.queues, self.concurrency, self.using)
        #: Rescue, partitions, purge and scheduler, off the claim path.
        self.maintainer = Maintainer(self.using, on_error=self._stop_if_not_migrated,
                                     name=self.worker_id)
        #: Records every outcome (the invariant: recorded, or back in the queue).
        self.recorder = Recorder(self.using, give_up=self._force)
        #: Releases the children of ended parents, on a thread of its own.
        self.releaser = Releaser(self.using, interval=max(self.poll_interval, 0.1))
        #: The outcomes handed in (by pool threads and the watchdog), recorded by the loop in
        #: batches; then their callbacks (signals, finished(), log lines), on their thread.
        self.completion = Completion(self.recorder, window=s.COMPLETION_WINDOW,
                                     wakeup=self._wakeup, on_release=self.releaser.wake,
                                     lost=self._lost_outcomes)
        #: Heartbeats, cancellations, time limits and wake-ups, on a thread of its own.
        self.watchdog = Watchdog(
            worker_id=self.worker_id, using=self.using, queues=self.queues,
            concurrency=self.concurrency, liveness=self.liveness, wakeup=self._wakeup,
            pool=lambda: self._pool, on_release=self.releaser.wake,
            hand_in=self.completion.hand_in, retry_after=retry_after, stop=self._stop_with,
            parent_pid=self.parent_pid)
        #: Runs one task on a pool thread and hands its outcome in (or, with
        #: COMPLETION_WINDOW = 0, records it itself).
        self.executor = Executor(
            using=self.using, worker_id=self.worker_id, concurrency=self.concurrency,
            recorder=self.recorder, hand_in=self.completion.hand_in,
            batched=s.COMPLETION_WINDOW > 0, rest=self._rest, ran=self.prefetch.ran,
            lost=self._lost_outcomes, request_stop=self.request_stop,
            task_pause=self.task_pause, stopping=self._stop)

    # -- the loop --------------------------------------------------------------------------

    def run(self, install_signals: bool = True) -> int:
        """Work until stopped (or, in burst mode, until idle). Returns a process exit code.

        ``install_signals``: this worker owns its process (the command's): it installs the
        signal handlers of a graceful shutdown, and freezes its start-up out of the garbage
        collector. ``False`` for a worker run in a process it shares (a test's)."""
        if install_signals:
            self._install_signal_handlers()
        pool = self._start()
        if install_signals:
            # A worker that owns its process (the command's): what start-up made (Django,
            # the apps, the handlers' modules, the threads) lives as long as the process, so
            # it is frozen out of the collector's generations; its full passes, which the
            # claimed tasks' objects coming and going set off, no longer walk it each time
            # (about a tenth of a short task's CPU in the worker). And the collector's first
            # pass waits for more new objects (GC_THRESHOLD): see there.
            gc.collect()
            gc.freeze()
            gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
        try:
            if self.burst:  # what the rescue and the scheduler give back or make is work too
                self.maintainer.wait_first_round()
            look = True  # is there reason to claim? (start-up, a wake-up, a full last claim)
            while not self._stop.is_set():
                if self._check_orphans:
                    self._give_back_orphans()
                if self.completion.record() and self.burst:
                    # Outcomes just recorded, maybe the last: no wake-up will follow them, so
                    # a burst worker claims again now (a retry they made due is found, or
                    # nothing, and it ends) rather than at its next poll.
                    look = True
                busy = pool.busy  # sampled before the claim, see the burst check below
                recording = self.completion.due_in() is not None
                wanted = self.prefetch.wanted(self.concurrency - pool.resting, busy)
                if not wanted or not (look or self._poll_due()):
                    # Until woken (new work, a free slot), the next poll, or maintenance.
                    look = self._sleep(self._idle_timeout()) or look
                    continue
                tasks = self._claim(wanted)
                if tasks is None:  # database error: paused already, try again
                    continue
                for task in tasks:
                    pool.submit(task, time_limit(task))
                look = len(tasks) == wanted  # a full claim: there may be more waiting
                if tasks:
                    continue
                # Idle only if nothing ran or waited to be recorded when the claim began: a
                # task finishing during the claim may have just made itself due again (a
                # retry), after its snapshot; nor while a rate limit holds tasks back.
                if self.burst and not (busy or recording or _held_back(tasks)):
                    if self._release_now():
                        continue
                    break
                self.listener.claimed_all_due()
            self.maintainer.stop()
            code = max(self._shutdown(pool), self._exit_code)
        finally:
            self._stop_parts()
            if self._signals is not None:
                self._signals.put(None)  # the relay's thread ends
        logger.info("Worker %s stopped after %d task(s).", self.worker_id, self.processed)
        return code

    def _start(self) -> Pool:
        """Start the pool (running the executor) and the parts with threads of their own."""
        # Whether runs are traced, decided again now that the project (and its OpenTelemetry
        # SDK, if any) is set up.
        tracing.decide()
        logger.info(
            "Worker %s started: queues=%s concurrency=%d pool=%s burst=%s",
            self.worker_id, ",".join(self.queues), self.concurrency, self.pool_options.kind,
            self.burst,
        )
        # The pool first, while this process has one thread (the process pool forks its fork
        # server here).
        pool = self._pool = make_pool(self.pool_options, self.executor, self._wakeup,
                                      on_crash=self.executor.crashed, stop=self._stop_with)
        self.watchdog.start()  # registers the worker first
        if not self.burst:  # a burst worker releases on its loop when idle (_release_now)
            self.releaser.start()
        self.maintainer.start()
        return pool

    def _stop_parts(self) -> None:
        """Record what is left, let the callbacks finish, stop the parts (the watchdog last:
        it unregisters the worker)."""
        self.maintainer.join()
        self.completion.record(everything=True)
        # The outcome lines and signals of every recorded task come before "stopped", also
        # after a second Ctrl+C.
        if not self.completion.stop(CALLBACKS_STOP_WAIT):
            logger.warning("Worker %s: callbacks of recorded outcomes still running after "
                           "%gs; not waiting for them.", self.worker_id, CALLBACKS_STOP_WAIT)
        self.releaser.stop()
        self.watchdog.stop()  # unregisters the worker
        connections[self.using].close()

    def stop(self) -> None:
        """Ask the worker to stop claiming and finish what it runs (thread-safe)."""
        self._stop.set()
        self._wakeup.set()
        self.maintainer.stop()

    @property
    def processed(self) -> int:
        """Runs ended since the worker started."""
        return self.executor.processed

    @property
    def listener(self) -> Listener | None:
        """The listener whose notifications wake the loop (``None`` before it started)."""
        return self.watchdog.listener

    def _stop_with(self, code: int) -> None:
        """Stop, exiting with at least ``code`` (the watchdog's callback)."""
        self._exit_code = max(self._exit_code, code)
        self.stop()

    @property
    def asleep(self) -> bool:
        """The loop waits (for a wake-up, its next poll or a batch of outcomes) and no wake-up
        is pending: every wake-up given before this call has been handled (the loop went
        round, and claimed if it had a free thread). What a test or a debugger reads."""
        # The wake-up first: see _sleep for why this order makes the answer safe.
        return not self._wakeup.is_set() and self._asleep

    def _sleep(self, timeout: float) -> bool:
        """Wait until woken (new work, a free slot, a stop request) or ``timeout`` passes;
        ``True`` if woken."""
        self._asleep = True
        woken = self._wakeup.wait(timeout)
        # Not asleep before the wake-up is taken: a reader that sees no wake-up pending and
        # then the loop asleep knows that this sleep began after the last wake-up was taken.
        self._asleep = False
        if woken:  # a wake-up given after a timeout stays pending, for the next sleep
            self._wakeup.clear()
        return woken

    # -- callbacks of the parts (called on their threads) ----------------------------------

    def _rest(self, seconds: float) -> None:
        """The calling pool thread takes no task for ``seconds`` (its connection was
        refused)."""
        if self._pool is not None:
            self._pool.rest(seconds)

    def _lost_outcomes(self) -> None:
        """Outcomes could not be recorded (the database stayed unreachable): give those tasks
        back at the next turn of the loop."""
        self._check_orphans = True
        self._wakeup.set()

    def _poll_due(self) -> bool:
        """Time for the safety-net poll, or for a delayed task the listener heard of."""
        if time.monotonic() >= self._next_poll:
            return True
        due = self.listener.seconds_until_due() if self.listener is not None else None
        return due is not None and due <= 0

    def _idle_timeout(self) -> float:
        """How long the loop may sleep: the poll interval, cut short by the next batch of
        outcomes due and by the earliest delayed task the listener heard of."""
        now = time.monotonic()
        timeout = self._next_poll - now
        if (due := self.completion.due_in()) is not None:
            timeout = min(timeout, due)
        if self.listener is not None and (due := self.listener.seconds_until_due()) is not None:
            timeout = min(timeout, due)
        return max(timeout, 0.001)

    # -- steps of the main loop ------------------------------------------------------------

    def _prepare_session(self) -> None:
        """Give the loop's connection its session settings, once per connection (not to a
        pooled one: the settings would go back to the pool with it, to other code; nor
        behind a transaction pooler, which would leave them on one of its server sessions)."""
        connection = connections[self.using]
        connection.ensure_connection()
        if (connection.connection is not self._session and not transaction_pooler()
                and getattr(connection, "pool", None) is None):
            with connection.cursor() as cursor:
                cursor.execute(SESSION_SQL, [LOCK_TIMEOUT, STATEMENT_TIMEOUT])
            self._session = connection.connection

    def _claim(self, limit: int) -> list[Task] | None:
        """Claim up to ``limit`` tasks and set the next poll (``None``: a database error, after
        its pause)."""
        try:
            self._prepare_session()
            tasks = Task.objects.claim(self.worker_id, self.queues, limit=limit, using=self.using)
        except (DatabaseError, InterfaceError) as exc:
            self._check_orphans = True  # the claim may have committed before the error
            self._database_error("claiming tasks", exc)
            return None
        self._error_pause = pgtasks_settings.ERROR_PAUSE
        self._next_poll = time.monotonic() + self.poll_interval
        # A rate limit (or a full concurrency key) held tasks back: look again as soon as it
        # may allow more (django_pgtasks.lifecycle.claim).
        if (retry_in := getattr(tasks, "retry_in", None)) is not None:
            self._next_poll = min(self._next_poll, time.monotonic() + retry_in)
        return tasks

    def _give_back_orphans(self) -> None:
        """Give back tasks the database says this worker holds but it does not know of.

        A claim whose commit succeeded but whose reply was lost with the connection, or an
        outcome that could not be recorded while the database was unreachable, leaves tasks
        RUNNING under this (live) worker; no rescue would take them, since the worker is
        alive. Giving them back is guarded, so a task that finished meanwhile is left alone.
        """
        try:
            held = list(Task.objects.using(self.using).held_by(self.worker_id))
            known = self._pool.ids() if self._pool is not None else set()
            known |= self.completion.ids()
            orphans = [task for task in held if task.pk not in known]
            if orphans:
                count = Task.objects.unclaim(orphans, using=self.using)
                logger.warning("Worker %s gave back %d task(s) it held without knowing "
                               "(a lost claim reply or an unrecorded outcome).",
                               self.worker_id, count)
            self._check_orphans = False
        except (DatabaseError, InterfaceError) as exc:
            logger.error("Could not look for tasks of a lost claim: %s", exc)
            close_connection(self.using)

    def _release_now(self) -> bool:
        """A burst worker about to stop: release on this thread what is due (children of
        tasks that just ended may become ready); ``True`` if some edge was released."""
        try:
            self._prepare_session()
            return release.release_all(self.using) > 0
        except (DatabaseError, InterfaceError) as exc:
            self._database_error("releasing the dependents of ended tasks", exc)
            return False

    def _stop_if_not_migrated(self, exc: BaseException) -> bool:
        """Stop the worker (exit status 1) when ``exc`` says the database lacks the tables or
        columns of django-pgtasks: no retry can fix that, ``migrate`` can."""
        if not (isinstance(exc, NotMigratedError) or is_missing_schema(exc)):
            return False
        with self._stopping:  # the loop and the maintainer may both find out: one line
            if not self._stop.is_set():
                logger.critical("Worker %s stopping: %s", self.worker_id,
                                not_migrated(self.using))
            self._exit_code = 1
            self._stop.set()
        self._wakeup.set()  # called by the maintainer too, from its thread
        close_connection(self.using)  # the calling thread's connection
        return True

    def _database_error(self, what: str, exc: BaseException) -> None:
        if self._stop_if_not_migrated(exc):
            return
        # While the server refuses connections (restarting, overloaded), retry often enough
        # to resume within RECONNECT_PAUSE_MAX of its return.
        limit = RECONNECT_PAUSE_MAX if is_connection_loss(exc) else pgtasks_settings.ERROR_PAUSE_MAX
        pause = min(self._error_pause, limit)
        logger.error("Database error while %s: %s; retrying in %.1fs.", what, exc, pause)
        close_connection(self.using)
        self._stop.wait(pause)
        self._error_pause = min(pause * 2, limit)

    # -- shutdown --------------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop as ``SIGTERM`` or Ctrl+C would (thread-safe): the first request finishes the
        running tasks (within ``SHUTDOWN_GRACE``), a second one exits at once."""
        if self._stop.is_set():
            logger.warning("Again %s: exiting now.", reason)
            self._force.set()
            self._wakeup.set()
        else:
            # Started handlers only: a prefetched task goes back to the queue unstarted.
            logger.info(
                "%s: finishing %d running task(s) (grace %.0fs); send SIGTERM or SIGINT "
                "again to exit at once.",
                reason, self._pool.started if self._pool else 0, self.shutdown_grace,
            )
            self.stop()

    def _install_signal_handlers(self) -> None:
        """``SIGTERM`` and ``SIGINT`` stop the worker (:meth:`request_stop`), on a thread of
        their own. A Python signal handler runs on the main thread between two of its
        bytecodes, wherever that thread is: inside a lock the loop holds (the pool's, an
        event's), or inside the handler of the signal before. A handler that took such a
        lock itself waited for its own thread for ever: a second ``SIGTERM`` on the heels of
        the first (a process manager's and the supervisor's) once hung a worker that way. So
        the handler only hands the signal over, with ``SimpleQueue.put``, which is reentrant
        and takes no lock a Python thread can hold."""
        signals: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        reasons = {signal.SIGTERM: "SIGTERM received", signal.SIGINT: "SIGINT received"}

        def relay() -> None:
            while (reason := signals.get()) is not None:
                self.request_stop(reason)

        def handle(signum: int, frame: FrameType | None) -> None:
            signals.put(reasons.get(signum, "A signal received"))

        threading.Thread(target=relay, name="pgtasks-signals", daemon=True).start()
        self._signals = signals
        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def _shutdown(self, pool: Pool) -> int:
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
            self.completion.record()
            self._sleep(min(0.2, max(deadline - time.monotonic(), 0.01),
                            self.completion.due_in() or 0.2))
        if not pool.busy:
            self.completion.record(everything=True)
            pool.shutdown()
            return 0
        # Tasks still running past the grace period: their runs are interrupted (not failed)
        # and they go back to their place in the queue now, rather than when the rescue finds
        # them; then exit without waiting for their threads (Python cannot interrupt one). A
        # pool that can stop its runs (the process pool's children, the async pool's
        # coroutines) does so first: none runs on once its task is given back.
        self.completion.record(everything=True)
        unfinished = pool.running()
        pool.terminate()
        reason = reason_text(WorkerShutdown, f"Worker {self.worker_id} shut down before the "
                                             f"task finished (grace {self.shutdown_grace:g}s).")
        self.completion.interrupt(unfinished, reason)
        logger.warning("Worker %s exiting with %d task(s) unfinished; they were given back.",
                       self.worker_id, len(unfinished))
        return 1


def _held_back(tasks: list[Task]) -> bool:
    """Whether a rate limit or a full concurrency key held due tasks back from a claim."""
    return getattr(tasks, "retry_in", None) is not None
