"""Which database errors are transient and which end a session (``database/sqlstates.py``),
and which are lost races (``database/partition_moves.is_conflict``).

The errors are built as psycopg raises them, without a server: ``psycopg.errors.lookup()``
gives the class of a SQLSTATE, and Django wraps a driver's error in its own, with the
driver's as ``__cause__``."""

from __future__ import annotations

from types import SimpleNamespace

import django.db
import psycopg
import psycopg.errors
import pytest
from django.db.utils import DatabaseErrorWrapper

from django_pgtasks.database.partition_moves import is_conflict
from django_pgtasks.database.sqlstates import is_connection_loss, is_transient, sqlstates


def server_error(sqlstate: str, message: str = "from the server") -> psycopg.Error:
    """The psycopg exception the server's error ``sqlstate`` becomes."""
    return psycopg.errors.lookup(sqlstate)(message)


def through_django(cause: BaseException) -> django.db.Error:
    """``cause`` as Django's database layer re-raises it (its ``DatabaseErrorWrapper``): the
    Django exception of the same kind, caused by the driver's."""
    connection = SimpleNamespace(Database=psycopg, errors_occurred=False)
    with pytest.raises(django.db.Error) as excinfo, DatabaseErrorWrapper(connection):
        raise cause
    assert excinfo.value.__cause__ is cause
    return excinfo.value


def caused_by(exc: BaseException, cause: BaseException) -> BaseException:
    """``exc``, raised ``from cause``, as an ``except`` block re-raises it."""
    with pytest.raises(type(exc)) as excinfo:
        raise exc from cause
    return excinfo.value


TRANSIENT = [
    ("40001", "serialization failure"),
    ("40P01", "deadlock detected"),
    ("08000", "connection exception"),
    ("08006", "connection failure"),
    ("08001", "unable to connect"),
    ("08003", "connection does not exist"),
    ("53300", "too many connections"),
    ("53100", "disk full"),
    ("53200", "out of memory"),
    ("55P03", "lock not available (lock_timeout)"),
    ("57014", "query canceled (statement_timeout)"),
    ("57P01", "admin shutdown"),
    ("57P02", "crash shutdown"),
    ("57P03", "cannot connect now"),
]
PERMANENT = [
    ("23505", "unique violation"),
    ("23503", "foreign key violation"),
    ("22P02", "invalid text representation"),
    ("22003", "numeric value out of range"),
    ("42P01", "undefined table"),
    ("42703", "undefined column"),
    ("25P02", "in failed SQL transaction"),
    ("XX000", "internal error"),
    ("0A000", "feature not supported"),
    ("55000", "object not in prerequisite state"),  # class 55, but not 55P03
    ("57P04", "database dropped"),  # class 57, but not one listed
    ("40002", "transaction integrity constraint violation"),  # class 40, but not 40001
]


@pytest.mark.parametrize("sqlstate", [s for s, _ in TRANSIENT],
                         ids=[name for _, name in TRANSIENT])
def test_a_transient_error_is_transient_raw_and_through_django(sqlstate: str) -> None:
    exc = server_error(sqlstate)
    assert exc.sqlstate == sqlstate
    assert is_transient(exc)
    assert is_transient(through_django(exc))


@pytest.mark.parametrize("sqlstate", [s for s, _ in PERMANENT],
                         ids=[name for _, name in PERMANENT])
def test_an_error_that_would_happen_again_is_not_transient(sqlstate: str) -> None:
    exc = server_error(sqlstate)
    assert not is_transient(exc)
    assert not is_transient(through_django(exc))


def test_an_error_of_the_driver_itself_is_transient() -> None:
    """"The connection is closed" and the like have no SQLSTATE: a new connection may help."""
    assert is_transient(psycopg.OperationalError("the connection is closed"))
    assert is_transient(psycopg.InterfaceError("the connection is lost"))
    assert is_transient(through_django(psycopg.OperationalError("consuming input failed")))


def test_djangos_own_errors_without_a_driver_cause() -> None:
    assert is_transient(django.db.InterfaceError("connection already closed"))
    assert is_transient(django.db.OperationalError("no cause"))
    assert not is_transient(django.db.IntegrityError("no cause"))
    assert not is_transient(ValueError("not a database error"))


def test_any_transient_error_in_the_chain_of_causes_counts() -> None:
    outer = caused_by(server_error("XX000", "wrapped"), server_error("40P01"))
    assert sqlstates(outer) == ["XX000", "40P01"]
    assert is_transient(outer)


def test_sqlstates_follows_explicit_causes_only_and_stops_at_a_loop() -> None:
    first, second = server_error("23505"), server_error("08006")
    first.__cause__ = second
    second.__cause__ = first  # a loop must not hang the check
    assert sqlstates(first) == ["23505", "08006"]
    assert sqlstates(ValueError("no database error")) == []
    implicit = server_error("23505")
    implicit.__context__ = server_error("08006")  # context, not cause: not followed
    assert sqlstates(implicit) == ["23505"]


# -- connection loss: a handler's exception that is an interruption, not a failure ----------


@pytest.mark.parametrize(("sqlstate", "lost"), [
    ("08006", True),  # connection failure
    ("08003", True),
    ("53300", True),  # too many clients: refused
    ("57P01", True),  # terminated by the administrator (pg_terminate_backend)
    ("57P02", True),
    ("57P03", True),
    ("53100", False),  # disk full: the server is there
    ("40001", False),  # transient, but the session lives on
    ("55P03", False),
    ("57014", False),  # a statement timeout: the handler's statement, not the session
])
def test_connection_loss_is_the_narrower_question(sqlstate: str, lost: bool) -> None:
    exc = server_error(sqlstate)
    assert is_connection_loss(exc) is lost
    assert is_connection_loss(through_django(exc)) is lost


def test_a_closed_connection_is_a_loss() -> None:
    assert is_connection_loss(psycopg.OperationalError("the connection is closed"))
    assert is_connection_loss(django.db.InterfaceError("connection already closed"))


def test_a_handlers_own_error_caused_by_a_lost_connection_is_a_loss() -> None:
    exc = caused_by(RuntimeError("could not save the report"),
                    server_error("57P01", "terminating connection due to administrator command"))
    assert is_connection_loss(exc)


@pytest.mark.parametrize("exc", [
    django.db.OperationalError("no driver cause"),
    server_error("23505"),
    ValueError("nothing to do with the database"),
    KeyboardInterrupt(),
])
def test_other_errors_are_not_a_loss(exc: BaseException) -> None:
    assert not is_connection_loss(exc)


def test_the_first_driver_error_in_the_chain_decides() -> None:
    # A driver error that is no loss, caused by one that is: the outer one decides.
    outer = server_error("53100")
    outer.__cause__ = server_error("08006")
    assert not is_connection_loss(outer)


# -- lost races --------------------------------------------------------------------------------


@pytest.mark.parametrize(("sqlstate", "conflict"), [
    ("40001", True), ("40P01", True), ("55P03", False), ("08006", False), ("23505", False),
])
def test_a_conflict_is_a_serialization_failure_or_a_deadlock(
    sqlstate: str, conflict: bool,
) -> None:
    exc = through_django(server_error(
        sqlstate, "tuple to be locked was already moved to another partition"))
    assert is_conflict(exc) is conflict


def test_an_error_without_a_sqlstate_is_no_conflict() -> None:
    assert not is_conflict(psycopg.OperationalError("the connection is closed"))
    assert not is_conflict(django.db.OperationalError("no cause"))
