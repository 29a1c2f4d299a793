"""Run several worker processes under one supervisor (``run_pgtasks --processes N``).

Each child runs one :class:`~django_pgtasks.worker.Worker`. On Linux a child is forked from
the supervisor, which has already set Django up, so it starts working within milliseconds
instead of importing everything again; before each fork the supervisor closes every database
connection and connection pool it has (so none is ever shared with a child), and the child
drops the supervisor's signal handlers before anything else. Elsewhere a child is a fresh
interpreter (``spawn``). The supervisor
restarts a child that dies, with a growing pause if children keep dying at start-up, and
forwards SIGTERM/SIGINT: the first asks every child to finish its running tasks, the second
makes them exit at once. Children sit in their own process group so a terminal's Ctrl-C
reaches them only through the supervisor, once.

When the queues to serve live on several databases (``PGTASKS["QUEUES"]`` with
``"database"`` options, see :mod:`django_pgtasks.definition.routing`), each database gets its own
children: every child works against one database only, so a database that goes away stalls
its own children (which wait and reconnect) and no other.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.connection import wait
from types import FrameType
from typing import Any

from django_pgtasks.telemetry.console import show_each_state_once

logger = logging.getLogger("django_pgtasks.supervisor")

#: A child that dies sooner than this after starting counts as a crash loop.
QUICK_DEATH = 5.0
MAX_RESTART_PAUSE = 30.0


def configure_logging(level: str) -> None:
    """Send django_pgtasks logs to stderr unless the project's LOGGING already handles them,
    and show each state change of a task once on the console
    (:mod:`django_pgtasks.telemetry.console`)."""
    show_each_state_once()
    logger = logging.getLogger("django_pgtasks")
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s [%(processName)s %(process)d] %(message)s"
        ))
        logger.addHandler(handler)


#: Signals the supervisor handles, and blocks while it forks a child.
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _start_method() -> str:
    """``fork`` on Linux (a child inherits the set-up Django), ``spawn`` elsewhere (forking a
    process that uses system frameworks is unsafe on macOS, and Windows cannot fork)."""
    return "fork" if sys.platform.startswith("linux") else "spawn"


def _close_connections() -> None:
    """Close this process's database connections and pools before a fork: a child must never
    share a connection (or a pool's threads) with its parent."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        connection.close()
        pools = getattr(type(connection), "_connection_pools", {})
        if connection.alias in pools:  # Django's pool (OPTIONS["pool"]), only if created
            connection.close_pool()


def _child_main(options: dict[str, Any], log_level: str) -> None:
    # Forked: the supervisor's handlers are not ours (they would signal our siblings); the
    # signals stayed blocked across the fork until the default action is back.
    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
    os.setpgrp()
    import random

    from django.apps import apps

    if not apps.ready:  # spawned: a fresh interpreter
        import django

        django.setup()
    random.seed()  # forked children would otherwise draw the same jitter
    from django_pgtasks.worker.loop import Worker

    configure_logging(log_level)
    raise SystemExit(Worker(**options).run())


class Supervisor:
    """Keeps ``processes`` children running for each set of worker options.

    ``worker_options`` is one set of :class:`~django_pgtasks.worker.Worker` arguments, or a
    list of them (one per database); each set gets ``processes`` children.
    """

    def __init__(
        self,
        processes: int,
        worker_options: dict[str, Any] | list[dict[str, Any]],
        log_level: str,
    ) -> None:
        groups = worker_options if isinstance(worker_options, list) else [worker_options]
        #: The worker options of each slot (a child process and its replacements).
        self.slots = [group for group in groups for _ in range(processes)]
        self.processes = len(self.slots)
        self.worker_options = groups[0]
        self.log_level = log_level
        self.context = multiprocessing.get_context(_start_method())
        self.children: dict[int, tuple[multiprocessing.process.BaseProcess, float]] = {}
        self.quick_deaths: dict[int, int] = {}
        self.generations: dict[int, int] = {}
        self.signals_received = 0

    def _start(self, slot: int) -> None:
        options = dict(self.slots[slot], parent_pid=os.getpid())
        generation = self.generations[slot] = self.generations.get(slot, -1) + 1
        if options.get("worker_id"):
            # A replacement never reuses the id of the child it replaces, so the tasks that
            # child left behind can be told apart from the replacement's own.
            suffix = f"-{slot}" if generation == 0 else f"-{slot}.{generation}"
            options["worker_id"] = f"{options['worker_id']}{suffix}"
        process = self.context.Process(
            target=_child_main, args=(options, self.log_level), name=f"pgtasks-worker-{slot}"
        )
        forking = self.context.get_start_method() == "fork"
        if forking:
            _close_connections()
            signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)
        try:
            process.start()
        finally:
            if forking:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        self.children[slot] = (process, time.monotonic())
        logger.info("Started worker process %d pid=%d database=%s", slot, process.pid,
                    options.get("using") or "default")

    def _signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals_received += 1
        # First signal: children finish running tasks. Second: they exit at once.
        for process, _ in self.children.values():
            if process.pid and process.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        for slot in range(self.processes):
            self._start(slot)
        exit_code = 0
        burst = self.worker_options.get("burst", False)
        while self.children:
            sentinels = {p.sentinel: slot for slot, (p, _) in self.children.items()}
            for sentinel in wait(list(sentinels), timeout=1.0):
                slot = sentinels[sentinel]
                process, started = self.children.pop(slot)
                process.join()
                code = process.exitcode
                if self.signals_received or (burst and code == 0):
                    exit_code = exit_code or (code or 0)
                    continue
                pause = self._restart_pause(slot, time.monotonic() - started)
                logger.error(
                    "Worker process %d pid=%d exited with code %s; restarting in %.1fs.",
                    slot, process.pid, code, pause,
                )
                if pause:
                    time.sleep(pause)
                if not self.signals_received:
                    self._start(slot)
        logger.info("All worker processes stopped.")
        return exit_code

    def _restart_pause(self, slot: int, lived: float) -> float:
        if lived >= QUICK_DEATH:
            self.quick_deaths[slot] = 0
            return 0.0
        self.quick_deaths[slot] = self.quick_deaths.get(slot, 0) + 1
        return min(0.5 * 2 ** (self.quick_deaths[slot] - 1), MAX_RESTART_PAUSE)
