"""How many tasks the worker's loop claims at a time: enough to fill its free threads, and with
``PGTASKS["PREFETCH"]`` some more, held in the pool until a thread takes them.

A prefetched task saves its thread the wait for the next claim; for tasks of a few
milliseconds that wait is most of the time. ``"auto"`` follows the worker's recent run times
so that a prefetched task never waits much longer than ``PREFETCH_HORIZON`` for its thread.
"""

from __future__ import annotations

#: ``PREFETCH = "auto"`` never holds more than this many waiting tasks per thread.
AUTO_PREFETCH_PER_THREAD = 10
#: Weight of the latest run in the running mean of run times that "auto" prefetch follows.
RUN_TIME_WEIGHT = 0.1


class Prefetch:
    """The size of the worker's claims. It owns the running mean of the worker's run times
    (:attr:`mean_run_time`), fed by :meth:`ran` from the pool threads.

    ``setting``: tasks claimed beyond the free threads, a number or ``"auto"``;
    ``concurrency``: the worker's threads; ``horizon``: ``PREFETCH_HORIZON``, in seconds.
    """

    def __init__(self, setting: int | str, concurrency: int, horizon: float) -> None:
        self.setting = setting
        self.concurrency = concurrency
        self.horizon = horizon
        #: Running mean of this worker's run times (seconds), for "auto" prefetch.
        self.mean_run_time: float | None = None

    def wanted(self, threads: int, busy: int) -> int:
        """How many tasks to claim now (0: none), with ``threads`` threads that take tasks
        (those that rest take none) and ``busy`` tasks in the pool: as many as fill the
        threads; with prefetch, once the prefetched tasks have all started, enough to fill
        the threads and the prefetch again."""
        ahead = self.ahead() if threads > 0 else 0
        if busy >= threads + (1 if ahead else 0):
            return 0
        return threads + ahead - busy

    def ahead(self) -> int:
        """Tasks to claim beyond the free threads. ``"auto"``: what the threads run in about
        ``horizon`` seconds at the recent mean run time, so that a prefetched task waits
        about that long at most: none before a run time is known or for tasks longer than
        the horizon, up to ``AUTO_PREFETCH_PER_THREAD`` per thread for very short ones."""
        if self.setting != "auto":
            return int(self.setting)
        mean = self.mean_run_time
        if mean is None:
            return 0
        ahead = self.concurrency * self.horizon / max(mean, 1e-6)
        return min(int(ahead), AUTO_PREFETCH_PER_THREAD * self.concurrency)

    def ran(self, seconds: float) -> None:
        """A pool thread ran a task for ``seconds`` (handler and hand-in): update the mean."""
        mean = self.mean_run_time
        self.mean_run_time = seconds if mean is None else mean + (seconds - mean) * RUN_TIME_WEIGHT
