"""A pool thread refused a connection rests, longer each refusal in a row, and the worker
warns once per episode (``worker/connecting.py``). The refusals of a real server are tested
in ``tests/chaos/test_refused_connections.py``."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace

import psycopg.errors
import pytest
from django.db import connections

from django_pgtasks.worker.connecting import (
    REST_MAX,
    ThreadConnections,
    _note_opened,
    opened_in_thread,
)

REFUSED = psycopg.errors.lookup("53300")("sorry, too many clients already")


def test_each_refusal_in_a_row_doubles_the_rest_up_to_a_bound(pgtasks) -> None:
    pgtasks(ERROR_PAUSE=0.5)
    threads = ThreadConnections("default", "w1", concurrency=4)
    rests = [threads.refusal(REFUSED) for _ in range(8)]
    assert rests == [0.5, 1.0, 2.0, 4.0, 8.0, REST_MAX, REST_MAX, REST_MAX]
    assert threads.refused == 8


def test_each_thread_rests_by_its_own_count(pgtasks) -> None:
    pgtasks(ERROR_PAUSE=1.0)
    threads = ThreadConnections("default", "w1", concurrency=2)
    threads.refusal(REFUSED)
    threads.refusal(REFUSED)
    other: list[float] = []
    thread = threading.Thread(target=lambda: other.append(threads.refusal(REFUSED)))
    thread.start()
    thread.join()
    assert other == [1.0]  # its first refusal
    assert threads.refused == 3  # counted for the worker


def test_the_worker_warns_once_saying_what_to_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    threads = ThreadConnections("default", "w1", concurrency=25)
    with caplog.at_level(logging.INFO, logger="django_pgtasks.worker"):
        for _ in range(3):
            threads.refusal(REFUSED)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    message = warning.getMessage()
    assert message.startswith("Worker w1: the database refused a connection to a pool thread "
                              "(psycopg.errors.TooManyConnections: sorry, too many clients "
                              "already).")
    assert "The worker runs 25 threads" in message
    assert "lower --concurrency, raise the server's max_connections" in message


@pytest.mark.parametrize(("atomic", "batched", "needed"), [
    (True, True, True),  # its transaction opens before it starts
    (False, False, True),  # the thread records the outcome itself
    (False, True, False),
])
def test_a_handler_seen_not_to_use_the_database_starts_without_a_connection(
    atomic: bool, batched: bool, needed: bool,
) -> None:
    threads = ThreadConnections("default", "w1", 1)
    assert threads.needed("tests.unit.quiet", atomic, batched)  # not known yet: assumed
    with threads.watching("tests.unit.quiet"):
        pass  # a handler that sends no statement
    assert threads.needed("tests.unit.quiet", atomic, batched) is needed
    assert threads.needed("tests.unit.other", atomic, batched)


def test_an_alias_removed_from_the_settings_is_no_longer_listed_as_opened() -> None:
    """A database added for a while and removed (tests do): its connection was opened in
    this thread, and the thread's next reset (or that of a process forked from it) must not
    ask Django for an alias it no longer knows."""
    connections.settings["for_a_while"] = dict(connections.settings["default"])
    try:
        _note_opened(None, SimpleNamespace(alias="for_a_while"))
        assert "for_a_while" in opened_in_thread()
    finally:
        del connections.settings["for_a_while"]
    assert "for_a_while" not in opened_in_thread()
    for alias in opened_in_thread():
        connections[alias]  # every alias listed is one Django knows
