"""A pool thread's connection to the task database, got before its handler starts.

A handler that uses the database used to open its thread's connection with its first query.
When the server refused it (``too many clients``, starting up, shutting down), the handler had
already started, so the run ended as an interruption; a worker with more threads than the
server has connections for sent tasks round the queue until their interruption budget was
spent, and they ended ``FAILED`` without their handler ever having done anything.

Now the thread gets its connection first. If the server refuses it, the handler has not
started: the task goes back to the queue as if never claimed
(:data:`~django_pgtasks.lifecycle.transitions.UNCLAIM_SQL`: no attempt, no interruption
spent), recorded by the worker's loop on its own connection; the thread rests before it takes
another task (the loop claims only for the threads that do not rest), and the worker logs one
warning that says what to change.

Where the line is: only the connection to the task database (``PGTASKS["DATABASE"]``, the one
the worker claims from), and only before the handler starts. A connection the handler opens
itself once it runs (to another database, or again after it closed its own) is the handler's:
a refusal there ends the run as a lost connection does, an interruption.

Which handlers get a connection first is learned: a handler whose run sent no statement through
the thread's connection is then started without one, so that handlers that never touch the
database do not hold a connection per thread. ``atomic=True`` handlers always get one (their
transaction opens before they start), and so does every handler when ``COMPLETION_WINDOW = 0``
(the thread records the outcome itself).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError, InterfaceError, connections
from django.db.backends.signals import connection_created

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.database.sqlstates import is_transient
from django_pgtasks.definition.error_text import format_exception

logger = logging.getLogger("django_pgtasks.worker")

#: Longest rest of a thread the database keeps refusing: it tries again at least this often.
REST_MAX = 10.0
#: The warning is given again after this long without a refusal (a new episode).
WARN_AGAIN_AFTER = 600.0


class ThreadConnections:
    """The pool threads' connections to ``using``: opened before a handler starts, refusals
    counted and warned of, and which handlers need one (see the module docstring).

    Thread-safe: each pool thread opens its own Django connection.
    """

    def __init__(self, using: str, worker_id: str, concurrency: int) -> None:
        self.using = using
        self.worker_id = worker_id
        self.concurrency = concurrency
        #: Per handler name: whether a run of it sent a statement through its thread's
        #: connection (missing: not known yet, so assumed).
        self._uses: dict[str, bool] = {}
        self._local = threading.local()
        self._lock = threading.Lock()
        #: Connections refused to pool threads since the worker started.
        self.refused = 0
        self._last_refusal: float | None = None

    def needed(self, name: str, atomic: bool, batched: bool) -> bool:
        """Whether a run of handler ``name`` gets its thread's connection before it starts."""
        return atomic or not batched or self._uses.get(name, True)

    def connect(self) -> BaseException | None:
        """Open this thread's connection to ``using`` if it has none. Return the error if the
        server refused it (a transient error: to give the task back), else ``None``; an error
        that is not transient is left for the handler to meet, as it would have."""
        connection = connections[self.using]
        self._local.opened = False
        if connection.connection is not None:
            return None
        try:
            connection.ensure_connection()
        except (DatabaseError, InterfaceError) as exc:
            if not is_transient(exc):
                return None
            with contextlib.suppress(DatabaseError, InterfaceError):
                connection.close()
            return exc
        self._local.opened = True
        self._local.pause = None
        return None

    def watching(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Around a handler's call: learn whether handler ``name`` uses the connection; if
        not, close the one :meth:`connect` opened for it (nothing of it is needed).

        Most runs take the cheap paths: a handler known to use it is not watched; one seen
        not to use it starts without the thread's connection, so a run of it that opens one
        after all (Django's ``connection_created``) has used it, and the next runs get it
        first. Only a handler not seen yet has its statements watched."""
        uses = self._uses.get(name)
        if uses:
            return _UNWATCHED
        if uses is False:
            return _Opening(self._uses, name, self.using)
        return self._learning(name)

    @contextlib.contextmanager
    def _learning(self, name: str) -> Iterator[None]:
        """The first run of handler ``name``: whether it sends a statement through the
        thread's connection."""
        used = False

        def note(execute: Any, sql: Any, params: Any, many: bool, context: Any) -> Any:
            nonlocal used
            used = True
            return execute(sql, params, many, context)

        connection = connections[self.using]
        try:
            with connection.execute_wrapper(note):
                yield
        finally:
            self._uses[name] = used
            if not used and getattr(self._local, "opened", False):
                with contextlib.suppress(DatabaseError, InterfaceError):
                    connection.close()

    def refusal(self, exc: BaseException) -> float:
        """Note that the server refused this thread a connection (``exc``); log the worker's
        warning if it is the first in a while. Return how long the thread rests: from
        ``ERROR_PAUSE``, doubling on each refusal in a row, up to :data:`REST_MAX`."""
        pause = getattr(self._local, "pause", None)
        pause = (pgtasks_settings.ERROR_PAUSE if pause is None else min(pause * 2, REST_MAX))
        self._local.pause = pause
        now = time.monotonic()
        with self._lock:
            self.refused += 1
            warn = (self._last_refusal is None or now - self._last_refusal > WARN_AGAIN_AFTER)
            self._last_refusal = now
        if warn:
            logger.warning(
                "Worker %s: the database refused a connection to a pool thread (%s). Its task "
                "went back to the queue without spending an attempt, and threads refused a "
                "connection rest (up to %.0fs) before they take another task. The worker runs "
                "%d threads and each holds a connection while its handler uses the database: "
                "lower --concurrency, raise the server's max_connections, or give "
                "DATABASES[%r]['OPTIONS'] a connection pool. Further refusals are logged at "
                "INFO.", self.worker_id, _first_line(exc), REST_MAX, self.concurrency,
                self.using)
        return pause


_UNWATCHED = contextlib.nullcontext()

#: Per thread: how many connections were opened in it, by database alias (``counts``), and the
#: aliases of those opened and not seen closed since (``aliases``, see
#: :func:`opened_in_thread`).
_opened = threading.local()


def _note_opened(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.alias not in connections.settings:
        return  # a connection of no alias (Django's to the "postgres" database, say)
    state = _opened.__dict__
    counts = state.get("counts")
    if counts is None:
        counts = state["counts"] = {}
        state["aliases"] = set()
    counts[connection.alias] = counts.get(connection.alias, 0) + 1
    state["aliases"].add(connection.alias)


connection_created.connect(_note_opened, dispatch_uid="django_pgtasks.worker.opened")


def opened_in_thread() -> set[str]:
    """The aliases of the connections opened in this thread and not seen closed since: all
    that a pool thread has to reset after a task (most handlers open none). The caller
    removes an alias once it finds its connection closed; opening it again lists it again.

    An alias no longer in ``DATABASES`` is dropped (a database added for a while and removed
    at run time, as tests do): there is nothing of it to reset, and asking Django for it
    would raise. A process forked from this thread (the process pool's children) inherits the
    list, which therefore may name such an alias."""
    aliases = _opened.__dict__.get("aliases")
    if not aliases:
        return set()
    aliases.intersection_update(connections.settings)
    return aliases


def _times_opened(alias: str) -> int:
    counts = _opened.__dict__.get("counts")
    return counts.get(alias, 0) if counts else 0


class _Opening:
    """Around a run of a handler seen not to use the database (so started without the
    thread's connection): if the run opens the thread's connection to ``using``, the
    handler uses it after all."""

    __slots__ = ("_before", "_name", "_uses", "_using")

    def __init__(self, uses: dict[str, bool], name: str, using: str) -> None:
        self._uses = uses
        self._name = name
        self._using = using

    def __enter__(self) -> None:
        self._before = _times_opened(self._using)

    def __exit__(self, *exc_info: object) -> None:
        if _times_opened(self._using) != self._before:
            self._uses[self._name] = True


def _first_line(exc: BaseException) -> str:
    return format_exception(exc).partition("\n")[0].strip()
