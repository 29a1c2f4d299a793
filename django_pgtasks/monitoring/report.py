"""What the dashboard reports, row by row: plain dataclasses, ready for templates and JSON."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django_pgtasks.models import LIVE, Status
from django_pgtasks.monitoring.stats import QueueSize


def seconds_text(value: float | None) -> str:
    """A duration or an age for people: ``0.042s``, ``12.5s``, ``7m05s``, ``3h20m``, ``2d4h``."""
    if value is None:
        return "-"
    if value < 60:
        return f"{value:.3f}s" if value < 10 else f"{value:.1f}s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h"



@dataclass(frozen=True)
class QueueRow(QueueSize):
    """One queue now (exact counts, as :class:`~django_pgtasks.monitoring.stats.QueueSize`),
    and what it finished in the last hour."""

    #: Tasks of the queue that ended in the last 60 minutes, by final state.
    succeeded_last_hour: int
    failed_last_hour: int
    cancelled_last_hour: int

    @property
    def finished_last_hour(self) -> int:
        return self.succeeded_last_hour + self.failed_last_hour + self.cancelled_last_hour

    @property
    def oldest_waiting_text(self) -> str:
        return seconds_text(self.oldest_waiting)

    @property
    def longest_running_text(self) -> str:
        return seconds_text(self.longest_running)


@dataclass(frozen=True)
class NameCounts:
    """Tasks of one name: live ones now (exact), finished ones in the window (exact)."""

    name: str
    #: Status value -> count. Live states count every such task; finished states count the
    #: tasks that ended in the window.
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class ErrorGroup:
    #: The normalized first line of the error (see :func:`error_group_expression`).
    text: str
    #: Failed tasks of the group that ended in the window.
    count: int
    last_failed_at: datetime | None


@dataclass(frozen=True)
class StuckTask:
    id: int
    name: str
    queue: str
    worker: str | None
    attempt: int
    max_attempts: int
    #: Seconds since the lease was taken.
    running_for: float | None

    @property
    def running_for_text(self) -> str:
        return seconds_text(self.running_for)


@dataclass(frozen=True)
class WorkerRow:
    name: str
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    started_at: datetime
    last_seen_at: datetime
    #: Seconds since its last heartbeat, on the database clock.
    last_seen_ago: float
    #: Lost by the rules of :mod:`django_pgtasks.worker.liveness`: its tasks are rescued.
    lost: bool
    running: int

    @property
    def last_seen_text(self) -> str:
        return seconds_text(self.last_seen_ago)


@dataclass(frozen=True)
class HourPoint:
    #: Start of the hour (UTC).
    hour: datetime
    enqueued: int
    succeeded: int
    failed: int
    cancelled: int
    #: Tasks waiting or running at the end of the hour (now, for the current hour), derived
    #: from today's count and the hourly flows: an estimate.
    backlog: int


@dataclass(frozen=True)
class TableEstimate:
    """Whole-table numbers from PostgreSQL's statistics (as of the last ``ANALYZE``), or
    counted when the table is small."""

    #: Rows in the task table; ``None`` if the table was never analyzed.
    rows: int | None
    #: Status value -> estimated rows.
    by_status: dict[str, int]
    #: Counted exactly rather than estimated.
    exact: bool = False


@dataclass
class FailingRelease:
    """A release of a task's dependents that failed and waits for its next try."""

    #: The ended task whose dependents wait.
    id: int
    status: str
    failures: int
    next_try_in: float
    last_error: str


@dataclass
class ReleaseSummary:
    """The releases of workflow children still to do (django_pgtasks.lifecycle.release)."""

    pending: int
    #: Seconds since the oldest pending release's task ended (``None``: none pending).
    oldest_age: float | None
    failing_count: int
    failing: list[FailingRelease]


@dataclass
class DatabaseSnapshot:
    """Everything the dashboard shows for one database alias."""

    database: str
    hours: int
    #: Database time the snapshot was taken, and the start of its window.
    now: datetime
    since: datetime
    queues: list[QueueRow]
    names: list[NameCounts]
    names_truncated: bool
    error_groups: list[ErrorGroup]
    stuck: list[StuckTask]
    stuck_count: int
    workers: list[WorkerRow]
    chart: list[HourPoint]
    estimate: TableEstimate
    releases: ReleaseSummary

    @property
    def live_statuses(self) -> list[str]:
        """The states counted as they are now (the others: within the window)."""
        return [Status.WAITING, *LIVE]


# -- queries -----------------------------------------------------------------------------------
