"""System checks (``manage.py check``) for the ``PGTASKS`` setting and the database."""

from __future__ import annotations

import logging
import re
import sys
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError, connections

from django_pgtasks.conf import DEFAULTS, is_seconds, pgtasks_settings
from django_pgtasks.database.connection_budget import (
    SERVER_LIMITS_SQL,
    advice,
    available_connections,
    connections_needed,
)
from django_pgtasks.database.schema import missing_migrations
from django_pgtasks.definition.options import PRIORITY_MAX, PRIORITY_MIN, QUEUE_NAME_RE
from django_pgtasks.retry import POLICIES
from django_pgtasks.worker.pools import PoolOptions, check_options, connection_holders

#: A module path, as PGTASKS["TASK_MODULES"] lists them.
_MODULE_PREFIX_RE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _error(msg: str, id: str, hint: str | None = None) -> Error:
    return Error(msg, hint=hint, obj="PGTASKS", id=f"django_pgtasks.{id}")


@register(Tags.database, Tags.compatibility)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    alias = pgtasks_settings.DATABASE
    if alias not in settings.DATABASES:
        return [_error(
            f"PGTASKS['DATABASE'] is {alias!r}, which is not an alias in DATABASES.",
            "E001", hint=f"Use one of: {', '.join(settings.DATABASES)}.",
        )]
    if connections[alias].vendor != "postgresql":
        return [_error(
            f"The task database {alias!r} uses the {connections[alias].vendor!r} backend; "
            f"django-pgtasks needs PostgreSQL (django.db.backends.postgresql).",
            "E002", hint="Point PGTASKS['DATABASE'] at a PostgreSQL alias.",
        )]
    return []


def _queue_options() -> dict[str, Any]:
    """``{queue: options}`` of a dict ``PGTASKS["QUEUES"]`` (empty for a list or junk)."""
    queues = pgtasks_settings.QUEUES
    return queues if isinstance(queues, dict) else {}


@register(Tags.compatibility)
def check_queue_databases(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """Every database a queue is routed to (``"database"`` option) is a PostgreSQL alias."""
    errors: list[Error] = []
    reported: set[str] = set()
    for queue, options in _queue_options().items():
        if not isinstance(options, dict) or "database" not in options:
            continue
        alias = options["database"]
        if not isinstance(alias, str) or not alias:
            errors.append(_error(
                f"Queue {queue!r} has the 'database' option {alias!r}; it must be a database "
                f"alias (a string).", "E042",
            ))
        elif alias not in settings.DATABASES:
            errors.append(_error(
                f"Queue {queue!r} is on database {alias!r}, which is not an alias in "
                f"DATABASES.", "E040", hint=f"Use one of: {', '.join(settings.DATABASES)}.",
            ))
        elif connections[alias].vendor != "postgresql" and alias not in reported:
            reported.add(alias)
            errors.append(_error(
                f"Queue {queue!r} is on database {alias!r}, which uses the "
                f"{connections[alias].vendor!r} backend; django-pgtasks needs PostgreSQL.",
                "E041",
            ))
    return errors


@register(Tags.database)
def check_queue_tables(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Warning]:
    """Each queue database checked (``manage.py check --database ALIAS``) has the task table
    (W040) and every migration of django_pgtasks applied (W042).

    Like Django's own database checks, only the aliases in ``databases`` are queried.
    """
    queues = pgtasks_settings.QUEUES
    if (not databases or not queues or not isinstance(queues, list | tuple | dict)
            or check_database() or check_queue_databases()):
        return []
    if _run_by_migrate():
        return []  # migrate is about to create the tables this check would miss
    from django_pgtasks.definition.routing import queue_databases

    warnings: list[Warning] = []
    for alias in queue_databases():
        if alias not in databases:
            continue
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute("SELECT to_regclass('pgtasks_task') IS NOT NULL")
                present = cursor.fetchone()[0]
                missing = missing_migrations(cursor) if present else []
        except DatabaseError as exc:
            warnings.append(Warning(
                f"The queue database {alias!r} could not be reached to check for the task "
                f"table: {exc}".strip(), obj="PGTASKS", id="django_pgtasks.W041",
            ))
            continue
        if not present:
            warnings.append(Warning(
                f"The queue database {alias!r} has no task table (pgtasks_task): tasks of "
                f"its queues ({', '.join(_queues_on(alias)) or 'none'}) cannot be enqueued or "
                f"run.", obj="PGTASKS", id="django_pgtasks.W040",
                hint=f"Run: python manage.py migrate --database {alias}",
            ))
        elif missing:
            warnings.append(Warning(
                f"The queue database {alias!r} lacks {len(missing)} migration(s) of "
                f"django_pgtasks ({', '.join(missing)}): workers refuse to start there and "
                f"enqueues may fail.", obj="PGTASKS", id="django_pgtasks.W042",
                hint=f"Run: python manage.py migrate --database {alias}",
            ))
        else:
            warnings.extend(_history_warnings(alias))
            warnings.extend(_release_warnings(alias))
    return warnings


def _release_warnings(alias: str) -> list[Warning]:
    """Releases of workflow children that failed and wait for their next try (W073); see
    django_pgtasks.lifecycle.release."""
    from django_pgtasks.monitoring.dashboard import releases

    summary = releases(alias)
    if not summary.failing_count:
        return []
    first = summary.failing[0]
    return [Warning(
        f"{summary.failing_count} release(s) of workflow children in {alias!r} failed and are "
        f"retried with back-off; their children wait meanwhile. The first, of task "
        f"{first.id}: {first.last_error.strip().splitlines()[0] if first.last_error else '?'}",
        obj="PGTASKS", id="django_pgtasks.W073",
        hint="See the dashboard's 'Workflow releases' and the workers' log; once the cause is "
             "gone the next try releases them (no handler runs again).",
    )]


def _history_warnings(alias: str) -> list[Warning]:
    """The history partitions of ``alias`` are made ahead (W071) and no finished task landed
    past them (W070: the maintenance moves it; W072: it ended further in the future than the
    maintenance makes periods); see django_pgtasks.patterns.partitions."""
    from django_pgtasks.patterns.partitions import health

    report = health(alias)
    warnings = []
    if report.past_periods:
        warnings.append(Warning(
            f"{report.past_periods} finished task(s) in {alias!r} ended after the last history "
            f"period made ({', '.join(report.tables_past)}): they are kept, in the catch "
            f"partition, until the maintenance makes their periods.",
            obj="PGTASKS", id="django_pgtasks.W070",
            hint="Run a worker (run_pgtasks): its maintenance makes the periods and moves "
                 "these rows into them.",
        ))
    if report.beyond_reach:
        # Not for the maintenance to fix: it makes periods HISTORY_PREMAKE ahead, not up to
        # any time a row claims, and it does not rewrite an end it did not record.
        warnings.append(Warning(
            f"{report.beyond_reach} finished task(s) in {alias!r} ended further in the future "
            f"than the history periods are made (the latest at {report.latest_beyond}; "
            f"{', '.join(report.tables_beyond)}): the maintenance makes periods only "
            f"PGTASKS['HISTORY_PREMAKE'] periods ahead, so they stay in the catch partition, "
            f"and out of the purge's reach, until their periods are made ('infinity': never).",
            obj="PGTASKS", id="django_pgtasks.W072",
            hint="Only raw SQL or a wrong clock writes such an end. Set finished_at of these "
                 "tasks to when they really ended (an UPDATE moves each row into its period), "
                 "or delete them; or raise PGTASKS['HISTORY_PREMAKE'] beyond their ends.",
        ))
    if report.short:
        warnings.append(Warning(
            f"The history partitions of {alias!r} reach only to {report.reach:%Y-%m-%d %H:%M} "
            f"UTC: no worker has run their maintenance lately.",
            obj="PGTASKS", id="django_pgtasks.W071",
            hint="Run a worker (run_pgtasks); PGTASKS['PARTITION_INTERVAL'] sets how often it "
                 "makes periods ahead.",
        ))
    return warnings


def _run_by_migrate() -> bool:
    """Whether these checks run at the start of ``manage.py migrate`` (or ``call_command``):
    Django runs its database checks there with the same arguments as ``check --database``,
    and nothing else tells the two apart than the command on the call stack."""
    from django.core.management.commands.migrate import Command as Migrate

    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back
    return False


def _queues_on(alias: str) -> list[str]:
    from django_pgtasks.definition.routing import queues_on

    return queues_on(alias)


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    errors: list[Error | Warning] = []
    user = pgtasks_settings.user_settings
    for key in sorted(set(user) - set(DEFAULTS)):
        errors.append(_error(
            f"PGTASKS has an unknown key {key!r}.", "E003",
            hint="See the settings reference for the valid keys (is it misspelt?).",
        ))
    queues = pgtasks_settings.QUEUES
    if not isinstance(queues, list | tuple | dict) or not queues:
        errors.append(_error("PGTASKS['QUEUES'] must be a non-empty list or dict.", "E004"))
        return errors
    for name, options in _queue_options().items():
        if options is not None and not isinstance(options, dict):
            errors.append(_error(
                f"PGTASKS['QUEUES'][{name!r}] must be a dict of options (e.g. "
                f"{{'database': 'queue_a'}}), not {options!r}.", "E014",
            ))
    for name in pgtasks_settings.queue_names:
        if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
            errors.append(_error(
                f"Queue name {name!r} is invalid; use 1-100 letters, digits, '_', '.', ':' "
                f"or '-', starting with a letter or digit.", "E005",
            ))
    if pgtasks_settings.DEFAULT_QUEUE not in pgtasks_settings.queue_names:
        errors.append(_error(
            f"PGTASKS['DEFAULT_QUEUE'] {pgtasks_settings.DEFAULT_QUEUE!r} is not in "
            f"PGTASKS['QUEUES'].", "E006",
        ))
    priority = pgtasks_settings.DEFAULT_PRIORITY
    if not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        errors.append(_error(
            f"PGTASKS['DEFAULT_PRIORITY'] must be an integer from {PRIORITY_MIN} to "
            f"{PRIORITY_MAX}.", "E007",
        ))
    backoff = pgtasks_settings.BACKOFF
    if not callable(backoff) and backoff not in POLICIES:
        errors.append(_error(
            f"PGTASKS['BACKOFF'] is {backoff!r}; use one of {sorted(POLICIES)} or a callable.",
            "E008",
        ))
    positive_ints = ("MAX_ATTEMPTS", "CONCURRENCY", "ERROR_TEXT_LIMIT", "MAX_PAYLOAD_BYTES",
                     "MAX_PAYLOAD_DEPTH", "MAX_RESULT_BYTES", "MAX_INTERRUPTIONS",
                     "TASK_LOG_LENGTH")
    for key in positive_ints:
        value = getattr(pgtasks_settings, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            errors.append(_error(f"PGTASKS[{key!r}] must be a positive integer.", "E009"))
    non_negative = ("BACKOFF_BASE", "BACKOFF_MAX", "BACKOFF_JITTER", "TASK_PAUSE",
                    "SHUTDOWN_GRACE", "RESCUE_GRACE", "COMPLETION_WINDOW", "PREFETCH_HORIZON")
    positive = ("POLL_INTERVAL", "ERROR_PAUSE", "ERROR_PAUSE_MAX", "HEARTBEAT_INTERVAL",
                "WORKER_TIMEOUT", "RESCUE_INTERVAL", "CONTROLS_REFRESH")
    for key in non_negative + positive:
        value = getattr(pgtasks_settings, key)
        if not is_seconds(value) or (key in positive and value == 0):
            kind = "a positive" if key in positive else "a non-negative"
            errors.append(_error(f"PGTASKS[{key!r}] must be {kind} number of seconds.", "E010"))
    processes = pgtasks_settings.PROCESSES
    if processes != "auto" and (not isinstance(processes, int) or isinstance(processes, bool)
                                or processes < 1):
        errors.append(_error("PGTASKS['PROCESSES'] must be 'auto' or a positive integer.",
                             "E027"))
    prefetch = pgtasks_settings.PREFETCH
    if prefetch != "auto" and (not isinstance(prefetch, int) or isinstance(prefetch, bool)
                               or prefetch < 0):
        errors.append(_error("PGTASKS['PREFETCH'] must be 'auto' or an integer >= 0.", "E013"))
    pool_problem = check_options(PoolOptions(
        kind=pgtasks_settings.POOL, max_tasks_per_child=pgtasks_settings.MAX_TASKS_PER_CHILD,
        max_memory_per_child=pgtasks_settings.MAX_MEMORY_PER_CHILD,
        cancel_grace=pgtasks_settings.CANCEL_GRACE))
    if pool_problem:
        errors.append(_error(f"PGTASKS['POOL'], ['MAX_TASKS_PER_CHILD'], "
                             f"['MAX_MEMORY_PER_CHILD'] or ['CANCEL_GRACE']: {pool_problem}.",
                             "E025"))
    level = pgtasks_settings.TASK_LOG_LEVEL
    if level is not None and not (
            (isinstance(level, int) and not isinstance(level, bool))
            or (isinstance(level, str) and isinstance(logging.getLevelName(level), int))):
        errors.append(_error(
            f"PGTASKS['TASK_LOG_LEVEL'] must be a logging level ('DEBUG', 'INFO', 'WARNING', "
            f"'ERROR', 'CRITICAL' or a number) or None, not {level!r}.", "E026"))
    for key in ("LISTEN", "AUTODISCOVER", "TRACING"):
        if not isinstance(getattr(pgtasks_settings, key), bool):
            errors.append(_error(f"PGTASKS[{key!r}] must be True or False.", "E012"))
    if pgtasks_settings.LIVENESS not in ("advisory_lock", "heartbeat"):
        errors.append(_error(
            f"PGTASKS['LIVENESS'] is {pgtasks_settings.LIVENESS!r}; use 'advisory_lock' or "
            f"'heartbeat'.", "E011",
        ))
    modules = pgtasks_settings.TASK_MODULES
    if not isinstance(modules, list | tuple) or not all(
            isinstance(m, str) and _MODULE_PREFIX_RE.fullmatch(m) for m in modules):
        errors.append(_error(
            f"PGTASKS['TASK_MODULES'] must be a list of module paths (such as 'mysite' or "
            f"'shared.jobs'), not {modules!r}.", "E024",
        ))
    heartbeat = pgtasks_settings.HEARTBEAT_INTERVAL
    for key in ("RESCUE_GRACE", "WORKER_TIMEOUT"):
        value = getattr(pgtasks_settings, key)
        if (isinstance(value, int | float) and isinstance(heartbeat, int | float)
                and value < 2 * heartbeat):
            errors.append(Warning(
                f"PGTASKS[{key!r}] ({value}s) is less than two heartbeat intervals "
                f"({heartbeat}s each): live workers may be taken for lost.",
                obj="PGTASKS", id="django_pgtasks.W001",
            ))
    return errors


@register(Tags.compatibility)
def check_retention(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """The purge settings (see :mod:`django_pgtasks.patterns.retention`)."""
    errors: list[Error] = []
    s = pgtasks_settings
    for key in ("RETENTION", "FAILED_RETENTION", "ARCHIVE_RETENTION", "EVENT_RETENTION"):
        value = getattr(s, key)
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        if value is not None and not is_seconds(seconds):
            errors.append(_error(
                f"PGTASKS[{key!r}] must be a non-negative number of seconds, a timedelta, or "
                f"None (keep forever).", "E020",
            ))
    interval = s.PURGE_INTERVAL
    if interval is not None and not is_seconds(interval):
        errors.append(_error(
            "PGTASKS['PURGE_INTERVAL'] must be a non-negative number of seconds, or 0 or None "
            "to turn the automatic purge off.", "E010",
        ))
    batch = s.PURGE_BATCH
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        errors.append(_error("PGTASKS['PURGE_BATCH'] must be a positive integer.", "E009"))
    if not isinstance(s.ARCHIVE, bool):
        errors.append(_error("PGTASKS['ARCHIVE'] must be True or False.", "E012"))
    from django_pgtasks.patterns.partitions import PERIODS

    if s.HISTORY_PERIOD not in PERIODS:
        errors.append(_error(
            f"PGTASKS['HISTORY_PERIOD'] must be one of {', '.join(map(repr, PERIODS))}, not "
            f"{s.HISTORY_PERIOD!r}.", "E021"))
    premake = s.HISTORY_PREMAKE
    if not isinstance(premake, int) or isinstance(premake, bool) or not 2 <= premake <= 1000:
        errors.append(_error(
            "PGTASKS['HISTORY_PREMAKE'] must be a whole number of periods from 2 to 1000.",
            "E022"))
    interval = s.PARTITION_INTERVAL
    if (not isinstance(interval, int | float) or isinstance(interval, bool)
            or not 0 < interval <= 3600):
        errors.append(_error(
            "PGTASKS['PARTITION_INTERVAL'] must be a number of seconds from 0 (excluded) to "
            "3600: the maintenance that makes history periods ahead cannot be turned off.",
            "E023"))
    return errors


@register(Tags.compatibility)
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """Periodic tasks: ``SCHEDULE``, ``SCHEDULER_INTERVAL``, ``MISSED_RUNS``."""
    from django_pgtasks.definition.recurrence import MISSED_RUNS_POLICIES
    from django_pgtasks.scheduling.declarations import check

    errors: list[Error | Warning] = []
    interval = pgtasks_settings.SCHEDULER_INTERVAL
    if not is_seconds(interval):
        errors.append(_error(
            "PGTASKS['SCHEDULER_INTERVAL'] must be a non-negative number of seconds "
            "(0 turns the scheduler off).", "E010",
        ))
    policy = pgtasks_settings.MISSED_RUNS
    if policy not in MISSED_RUNS_POLICIES:
        errors.append(_error(
            f"PGTASKS['MISSED_RUNS'] is {policy!r}; use one of "
            f"{', '.join(map(repr, MISSED_RUNS_POLICIES))}.", "E033",
        ))
    for problem in check():
        make = Warning if problem.id.startswith("W") else Error
        errors.append(make(problem.message, hint=problem.hint, obj="PGTASKS",
                           id=f"django_pgtasks.{problem.id}"))
    return errors


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@register(Tags.compatibility)
def check_shutdown_grace(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """A worker finishing its tasks after SIGTERM must not be taken for lost meanwhile."""
    grace = pgtasks_settings.SHUTDOWN_GRACE
    timeout = pgtasks_settings.WORKER_TIMEOUT
    if not (_is_number(grace) and _is_number(timeout)) or grace < timeout:
        return []  # E010 reports values that are not numbers
    return [_error(
        f"PGTASKS['SHUTDOWN_GRACE'] ({grace}s) must be less than PGTASKS['WORKER_TIMEOUT'] "
        f"({timeout}s): a worker still finishing its tasks after SIGTERM could be taken for "
        f"lost, and its tasks run a second time elsewhere.", "E015",
        hint="Lower SHUTDOWN_GRACE, or raise WORKER_TIMEOUT above it.",
    )]


@register(Tags.compatibility)
def check_pooler(app_configs: Any = None, **kwargs: Any) -> list[Error | Warning]:
    """``POOLER`` and ``LISTEN_DATABASE``, and what contradicts a transaction pooler
    (docs/howto/pgbouncer.md)."""
    s = pgtasks_settings
    user = s.user_settings
    errors: list[Error | Warning] = []
    pooler = s.POOLER
    if pooler not in (None, "transaction"):
        errors.append(_error(
            f"PGTASKS['POOLER'] is {pooler!r}; use None (a direct connection, or a pooler in "
            f"session mode) or 'transaction' (PgBouncer's pool_mode = transaction).", "E016",
        ))
    direct = s.LISTEN_DATABASE
    mapping = ({s.DATABASE: direct} if isinstance(direct, str)
               else direct if isinstance(direct, dict) else {})
    if direct is not None and not isinstance(direct, str | dict):
        errors.append(_error(
            f"PGTASKS['LISTEN_DATABASE'] is {direct!r}; use a database alias, a dict "
            f"{{task database alias: alias}}, or None.", "E017",
        ))
    for task_alias, alias in mapping.items():
        if not isinstance(alias, str) or alias not in settings.DATABASES:
            errors.append(_error(
                f"PGTASKS['LISTEN_DATABASE'] names {alias!r} for the task database "
                f"{task_alias!r}, which is not an alias in DATABASES.", "E017",
                hint=f"Use one of: {', '.join(settings.DATABASES)}.",
            ))
        elif connections[alias].vendor != "postgresql":
            errors.append(_error(
                f"PGTASKS['LISTEN_DATABASE'] names {alias!r}, which uses the "
                f"{connections[alias].vendor!r} backend; it must reach the task database's "
                f"PostgreSQL server directly.", "E017",
            ))
        elif pooler == "transaction" and alias == task_alias:
            errors.append(_error(
                f"PGTASKS['LISTEN_DATABASE'] names the task database {alias!r} itself, which "
                f"PGTASKS['POOLER'] says is reached through a pooler in transaction mode: "
                f"notifications would be lost there.", "E019",
                hint="Add an alias to DATABASES that connects to PostgreSQL directly (same "
                     "database, past the pooler) and name it in LISTEN_DATABASE.",
            ))
    if pooler != "transaction":
        return errors
    if user.get("LIVENESS") == "advisory_lock":
        errors.append(_error(
            "PGTASKS['LIVENESS'] is 'advisory_lock', but PGTASKS['POOLER'] is 'transaction': a "
            "session-level lock taken through a transaction pooler is held by whichever "
            "server session ran that transaction, not by the worker, so it proves nothing.",
            "E018", hint="Remove LIVENESS (POOLER = 'transaction' implies 'heartbeat').",
        ))
    if user.get("LISTEN") is True and not mapping:
        errors.append(_error(
            "PGTASKS['LISTEN'] is True, but PGTASKS['POOLER'] is 'transaction' and no "
            "PGTASKS['LISTEN_DATABASE'] is set: LISTEN through a transaction pooler loses its "
            "notifications.", "E019",
            hint="Set LISTEN_DATABASE to an alias that connects to PostgreSQL directly, or "
                 "remove LISTEN (the workers then poll every POLL_INTERVAL seconds).",
        ))
    if s.LISTEN_DATABASE is not None and s.LISTEN is False:
        errors.append(Warning(
            "PGTASKS['LISTEN_DATABASE'] is set but PGTASKS['LISTEN'] is False: workers do not "
            "listen (Task.objects.wait() still does).", obj="PGTASKS",
            id="django_pgtasks.W002",
        ))
    from django_pgtasks.definition.routing import queue_databases

    for alias in queue_databases():
        entry = settings.DATABASES.get(alias)
        if entry is not None and not entry.get("DISABLE_SERVER_SIDE_CURSORS"):
            errors.append(Warning(
                f"PGTASKS['POOLER'] is 'transaction', but DATABASES[{alias!r}] does not set "
                f"DISABLE_SERVER_SIDE_CURSORS = True: QuerySet.iterator() (in the admin, your "
                f"code) would open server-side cursors, which a transaction pooler breaks.",
                obj="PGTASKS", id="django_pgtasks.W003",
                hint="Set DISABLE_SERVER_SIDE_CURSORS = True in that DATABASES entry.",
            ))
    return errors


@register(Tags.database)
def check_connection_budget(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[Warning]:
    """One worker process with ``CONCURRENCY`` threads fits in the connections each queue
    database's server accepts (:mod:`django_pgtasks.database.connection_budget`).

    Like :func:`check_queue_tables`, only the aliases in ``databases`` are queried.
    ``run_pgtasks`` repeats the comparison at start with its own ``--processes`` and
    ``--concurrency``.
    """
    threads = pgtasks_settings.CONCURRENCY
    queues = pgtasks_settings.QUEUES
    if pgtasks_settings.POOLER is not None:
        return []  # the workers' connections are the pooler's clients, not the server's
    if (not databases or not queues or not isinstance(queues, list | tuple | dict)
            or not isinstance(threads, int) or isinstance(threads, bool) or threads < 1
            or check_database() or check_queue_databases()):
        return []  # the settings checks report what is wrong with these
    from django_pgtasks.definition.routing import queue_databases

    warnings: list[Warning] = []
    for alias in queue_databases():
        if alias not in databases:
            continue
        try:
            with connections[alias].cursor() as cursor:
                cursor.execute(SERVER_LIMITS_SQL)
                max_connections, superuser_reserved, reserved = cursor.fetchone()
        except DatabaseError:
            continue  # check_queue_tables reports the unreachable database (W041)
        available = available_connections(max_connections, superuser_reserved, reserved)
        needed = connections_needed(1, connection_holders(pgtasks_settings.POOL, threads),
                                    connections[alias].settings_dict)
        if needed > available:
            warnings.append(Warning(
                f"One worker process with PGTASKS['CONCURRENCY'] = {threads} threads needs "
                f"up to {needed} connections to database {alias!r}, whose server accepts "
                f"{available} (max_connections {max_connections} minus "
                f"{superuser_reserved + reserved} reserved): its threads may fail with "
                f"'too many clients'.",
                hint=advice(alias, 1, available), obj="PGTASKS", id="django_pgtasks.W050",
            ))
    return warnings


#: A bearer token as RFC 6750 spells one (``b64token``).
_TOKEN_RE = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


@register(Tags.compatibility, Tags.security)
def check_metrics(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """``METRICS_TOKEN`` and ``METRICS_PERMISSION``, which protect the metrics view."""
    errors: list[Error] = []
    token = pgtasks_settings.METRICS_TOKEN
    tokens = [token] if isinstance(token, str) else token
    if token is not None and (not isinstance(tokens, list | tuple) or not tokens or not all(
            isinstance(t, str) and _TOKEN_RE.fullmatch(t) for t in tokens)):
        errors.append(_error(
            "PGTASKS['METRICS_TOKEN'] must be None, a token (a non-empty string of letters, "
            "digits and -._~+/, as in 'Authorization: Bearer <token>'), or a non-empty list "
            "of tokens.", "E060",
            hint="Generate one with: python -c 'import secrets; print(secrets.token_urlsafe())'",
        ))
    permission = pgtasks_settings.METRICS_PERMISSION
    if permission is not None and not (isinstance(permission, str)
                                       and re.fullmatch(r"[^.\s]+\.[^.\s]+", permission)):
        errors.append(_error(
            f"PGTASKS['METRICS_PERMISSION'] is {permission!r}; use None or a permission as "
            f"'app_label.codename' (for example 'django_pgtasks.view_task').", "E061",
        ))
    return errors
