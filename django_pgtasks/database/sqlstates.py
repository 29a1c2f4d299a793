"""Which database errors are worth trying again, and which end a session.

:func:`is_transient` says yes for a lost or refused connection, a serialization failure or
deadlock, a lock or statement timeout, and a server short of resources: the same statement may
succeed a moment later. Anything else (a value PostgreSQL refuses, a constraint, a programming
error) fails the same way every time. :func:`is_connection_loss` is the narrower question asked
of a handler's exception: did the run end because its connection went away (an interruption),
not because the handler failed?
"""

from __future__ import annotations

#: SQLSTATEs (or their two-character classes) of errors that may not happen again on retry.
TRANSIENT_SQLSTATES = frozenset({
    "08",  # connection exception: lost, refused, broken
    "40001", "40P01",  # serialization failure, deadlock detected
    "53",  # insufficient resources: too many connections, out of memory, disk full
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout)
    "57P01", "57P02", "57P03",  # admin shutdown, crash shutdown, cannot connect now
})
#: SQLSTATEs of errors that end a session: the run was cut off, not failed.
CONNECTION_SQLSTATES = frozenset({"08", "53300", "57P01", "57P02", "57P03"})


def sqlstates(exc: BaseException) -> list[str | None]:
    """The SQLSTATE of each psycopg error in ``exc``'s chain of causes (``None`` for an
    error raised by the driver itself, such as "the connection is closed")."""
    import psycopg

    found: list[str | None] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, psycopg.Error):
            found.append(current.sqlstate)
        current = current.__cause__
    return found


def _matches(sqlstate: str | None, codes: frozenset[str]) -> bool:
    return sqlstate is None or sqlstate in codes or sqlstate[:2] in codes


def is_transient(exc: BaseException) -> bool:
    """Whether the database error ``exc`` may not happen again if the statement is retried."""
    from django.db import InterfaceError, OperationalError

    if isinstance(exc, InterfaceError):
        return True
    states = sqlstates(exc)
    if not states:
        return isinstance(exc, OperationalError)
    return any(_matches(state, TRANSIENT_SQLSTATES) for state in states)


def is_connection_loss(exc: BaseException) -> bool:
    """Whether a handler's exception ``exc`` is its database connection going away (lost,
    terminated by the server, refused for too many clients), following explicit causes."""
    import psycopg
    from django.db import InterfaceError, OperationalError

    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, psycopg.OperationalError | psycopg.InterfaceError):
            return _matches(current.sqlstate, CONNECTION_SQLSTATES)
        if isinstance(current, InterfaceError):
            return True
        if isinstance(current, OperationalError) and current.__cause__ is None:
            return False
        current = current.__cause__
    return False
