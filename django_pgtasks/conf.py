"""Settings for django-pgtasks, read from the ``PGTASKS`` dict in Django settings.

Every key has a default, listed in :data:`DEFAULTS` and documented in
``docs/reference/settings.md``. Settings are read lazily (never at import time), so
``override_settings(PGTASKS=...)`` in tests takes effect immediately.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed

#: The documented defaults. Keys not listed here are rejected by the system checks.
DEFAULTS: dict[str, Any] = {
    # Database alias that holds the task table.
    "DATABASE": "default",
    # Queues that tasks may be enqueued to. A list of names, or a dict name -> options. The
    # option "database" puts a queue on another database alias (its own PostgreSQL server):
    # {"default": {}, "emails": {"database": "queue_a"}}. Enqueue, workers, rescue, purge,
    # the admin and pgtasks_stats follow it; see django_pgtasks.definition.routing and
    # docs/scaling.md.
    "QUEUES": ["default"],
    # Queue used when neither the handler nor the enqueue call names one.
    "DEFAULT_QUEUE": "default",
    # Priority used when neither the handler nor the enqueue call sets one (0..200, higher first).
    "DEFAULT_PRIORITY": 100,
    # Attempts a task gets before it ends FAILED (1 = never retried).
    "MAX_ATTEMPTS": 3,
    # Retry delay policy: "exponential" (with jitter) or "linear".
    "BACKOFF": "exponential",
    # Seconds: first retry delay (exponential) or the per-attempt step (linear).
    "BACKOFF_BASE": 10.0,
    # Seconds: upper bound for any retry delay.
    "BACKOFF_MAX": 3600.0,
    # Fraction of random jitter added to/subtracted from each retry delay (0 disables it).
    "BACKOFF_JITTER": 0.25,
    # Characters of error text (exception, message, traceback tail) kept per task.
    "ERROR_TEXT_LIMIT": 4000,
    # Largest accepted serialized JSON payload (args + kwargs), in bytes.
    "MAX_PAYLOAD_BYTES": 256 * 1024,
    # Deepest accepted nesting of lists/dicts in a payload.
    "MAX_PAYLOAD_DEPTH": 32,
    # Largest accepted result of a task, as JSON, in bytes; a larger one fails its task with
    # UnstorableResultError (results live in the task row; store big outputs elsewhere).
    "MAX_RESULT_BYTES": 1024 * 1024,
    # Times a task may be interrupted (its worker died, shut down or lost its database
    # connection) and run again without spending an attempt, before it fails for good.
    "MAX_INTERRUPTIONS": 5,
    # Worker processes run_pgtasks starts per database when --processes is not given: a number,
    # or "auto": one per CPU the command may use (its CPU affinity, capped by a cgroup CPU
    # quota), lowered to fit in half of the database's connections.
    "PROCESSES": "auto",
    # Tasks a worker process runs at once: its threads, child processes or coroutines.
    "CONCURRENCY": 4,
    # Where a worker runs handlers (run_pgtasks --pool): "thread" (threads of the worker
    # process), "process" (each task in a child process: hard time limits, memory limits,
    # crashes contained) or "async" (async def handlers on one event loop, hundreds at once).
    "POOL": "thread",
    # Process pool only: replace a child process after this many tasks (None: never).
    "MAX_TASKS_PER_CHILD": None,
    # Process pool only: replace a child whose resident memory after a task is above this
    # many MiB (None: never).
    "MAX_MEMORY_PER_CHILD": None,
    # Process pool only: seconds a running task's handler has to stop once its cancellation
    # reaches the worker; past them its child process is stopped (SIGTERM, SIGKILL 5 s
    # later) and the task ends CANCELLED. None: never stopped (cooperative only, as on the
    # thread and async pools).
    "CANCEL_GRACE": 10.0,
    # Tasks a worker claims beyond its free threads, so the next task is at hand the moment a
    # thread frees up and claims come in batches. They show as RUNNING while they wait, and
    # are given back at once (the attempt not counted) when the worker stops. "auto": as many
    # as its threads run in about PREFETCH_HORIZON seconds, judged by the run time of its
    # recent tasks (none for long tasks, up to 10 per thread for very short ones).
    "PREFETCH": "auto",
    # Seconds of work "auto" prefetch keeps at hand: claimed tasks wait at most about this long.
    "PREFETCH_HORIZON": 0.1,
    # Seconds successes are collected before being recorded together in one UPDATE
    # (default mode only; atomic=True handlers commit their own). 0 records each at once.
    "COMPLETION_WINDOW": 0.005,
    # Seconds an idle worker waits before looking for work again. With LISTEN on, new work
    # wakes it at once and this is only the safety net (lost notifications, poolers).
    "POLL_INTERVAL": 5.0,
    # Wake idle workers through LISTEN/NOTIFY. Turn off behind PgBouncer in transaction mode
    # (and lower POLL_INTERVAL, which then decides the latency).
    "LISTEN": True,
    # None, or "transaction": the task databases are reached through a pooler in transaction
    # mode (PgBouncer's pool_mode = transaction), which gives each transaction to any of its
    # server sessions. Workers then keep no session state there: heartbeat liveness, no
    # session settings, LISTEN only on LISTEN_DATABASE (else polling). docs/howto/pgbouncer.md.
    "POOLER": None,
    # Database alias on which workers and Task.objects.wait() LISTEN, instead of the task
    # database's: a direct connection to the same database, past the pooler. An alias (for
    # PGTASKS["DATABASE"]), or a dict {task database alias: alias}; None listens on the task
    # database itself (or, with POOLER = "transaction", polls).
    "LISTEN_DATABASE": None,
    # Seconds a process keeps its decision between the plain claim and the one that enforces
    # concurrency keys and rate limits (docs/howto/concurrency-limits.md). New keyed tasks or
    # a new rate limit are picked up within this time; pauses apply at once regardless.
    "CONTROLS_REFRESH": 1.0,
    # Log records a running task keeps with its row (context.logger, and any logger of the
    # project used during the run): this level and above ("DEBUG", "INFO", ..., or None: none).
    "TASK_LOG_LEVEL": "INFO",
    # Entries kept in a task's log; the oldest are dropped first.
    "TASK_LOG_LENGTH": 100,
    # Seconds paused between two tasks in one worker thread (0 = none).
    "TASK_PAUSE": 0.0,
    # Seconds paused after a database error; doubles on each further error up to ERROR_PAUSE_MAX.
    "ERROR_PAUSE": 0.5,
    "ERROR_PAUSE_MAX": 30.0,
    # Seconds running tasks get to finish after SIGTERM/SIGINT before the worker exits anyway.
    "SHUTDOWN_GRACE": 30.0,
    # Import the ``tasks`` module of every installed app at start-up so handlers register.
    "AUTODISCOVER": True,
    # Module prefixes (dotted paths, e.g. ["mysite", "shared.jobs"]) whose modules a stored
    # task name may import, besides those of installed apps and the project's own package
    # (the top-level package of the settings module and of ROOT_URLCONF). A worker imports
    # the module of a task it does not know only if it is under one of these.
    "TASK_MODULES": [],
    # How workers prove they are alive: "advisory_lock" (a session-level lock held on a
    # dedicated connection, plus heartbeats) or "heartbeat" (heartbeats only; for poolers
    # such as PgBouncer in transaction mode, where session-level locks do not work).
    # POOLER = "transaction" implies "heartbeat".
    "LIVENESS": "advisory_lock",
    # Seconds between two heartbeats of a worker (an UPDATE of its row in pgtasks_worker).
    "HEARTBEAT_INTERVAL": 2.0,
    # Seconds a worker whose liveness lock is gone must also have been silent before its
    # tasks are rescued: covers a database restart, during which every lock vanishes.
    "RESCUE_GRACE": 5.0,
    # Seconds without a heartbeat after which a worker counts as lost even if its lock is
    # held (hung process, or LIVENESS="heartbeat"); also the lease of tasks claimed by code
    # that is not a registered worker.
    "WORKER_TIMEOUT": 60.0,
    # Seconds between two rescue passes; one worker at a time runs each pass.
    "RESCUE_INTERVAL": 2.0,
    # Finished tasks (SUCCESSFUL, CANCELLED) are purged this long after they finished, on the
    # database clock: seconds or a timedelta; None keeps them forever. docs/howto/retention.md.
    "RETENTION": timedelta(days=7),
    # FAILED tasks are kept longer, so operators can inspect them (seconds, timedelta or None).
    "FAILED_RETENTION": timedelta(days=30),
    # Move purged tasks to the table pgtasks_task_archive instead of deleting them.
    "ARCHIVE": False,
    # Archived tasks are deleted this long after they were archived (None keeps them forever).
    "ARCHIVE_RETENTION": timedelta(days=90),
    # Events (Task.objects.send_event()) are deleted this long after they were sent, by the
    # purge turns: seconds or a timedelta; None keeps them forever. A task that waits for an
    # event deleted before its wait began waits for it to be sent again.
    "EVENT_RETENTION": timedelta(days=30),
    # Seconds between two purge turns in each worker; one worker at a time purges, and a turn
    # stops after 50 batches or 1 second. 0 or None turns the automatic purge off.
    "PURGE_INTERVAL": 300.0,
    # Rows deleted or archived per purge batch; each batch is its own short transaction.
    "PURGE_BATCH": 1000,
    # Finished tasks are kept in history tables partitioned by finished_at, one partition per
    # period: "hour", "day", "week" or "month" (UTC). Retention drops whole periods, so a task
    # is kept at most one period past its retention. docs/howto/history.md.
    "HISTORY_PERIOD": "day",
    # Periods made ahead of time by the workers' maintenance (at least 2).
    "HISTORY_PREMAKE": 3,
    # Seconds between two turns of that maintenance in each worker (one worker at a time).
    "PARTITION_INTERVAL": 60.0,
    # Periodic tasks declared in settings: schedule name -> {"task": "<registered name>",
    # "schedule": <period or cron>, and optionally "args", "kwargs", "queue", "timezone",
    # "enabled"}. Handlers can also declare one with @pgtask(schedule=...).
    # docs/howto/periodic.md.
    "SCHEDULE": {},
    # Seconds between two scheduler passes in each worker (0 turns the scheduler off there).
    "SCHEDULER_INTERVAL": 1.0,
    # Planned runs missed while no worker ran: "once" (one run stands for all of them),
    # "skip" (none), or "all" (one per missed time, at most 100).
    "MISSED_RUNS": "once",
    # Trace enqueues and runs with OpenTelemetry when opentelemetry-api is installed (the
    # "otel" extra) and an SDK has set a tracer provider; False turns it off regardless.
    # docs/howto/monitoring.md#tracing-with-opentelemetry.
    "TRACING": True,
    # The Prometheus metrics view (django_pgtasks.monitoring.metrics.metrics_view) answers
    # requests that send "Authorization: Bearer <token>" with this token (a string, or a list
    # of strings while rotating one). None: no token. With neither METRICS_TOKEN nor
    # METRICS_PERMISSION set, the view is open to anyone who reaches it.
    "METRICS_TOKEN": None,
    # ...and requests of a logged-in user who has this permission ("app_label.codename", e.g.
    # "django_pgtasks.view_task"). None: no permission check.
    "METRICS_PERMISSION": None,
}


class PgTasksSettings:
    """Attribute access to ``settings.PGTASKS`` merged over :data:`DEFAULTS`."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(django_settings, "PGTASKS", None)
        return dict(value) if value else {}

    def _merged(self) -> dict[str, Any]:
        if self._cache is None:
            self._cache = {**DEFAULTS, **self.user_settings}
        return self._cache

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(f"Unknown django-pgtasks setting {name!r}.")
        return self._merged()[name]

    @property
    def queue_names(self) -> list[str]:
        """Configured queue names, in the order they were declared."""
        queues = self.QUEUES
        return list(queues.keys()) if isinstance(queues, dict) else list(queues)

    def reload(self) -> None:
        self._cache = None


pgtasks_settings = PgTasksSettings()


def is_seconds(value: Any) -> bool:
    """Whether ``value`` is a number of seconds a setting (or an option of the same
    meaning) can hold: a finite number, 0 or more (not a bool, ``nan`` or ``inf``)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "PGTASKS":
        pgtasks_settings.reload()


setting_changed.connect(_reload)
