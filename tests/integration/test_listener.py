"""The listener thread on its own: what it hands on, and that stopping it is immediate."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from django_pgtasks.worker.listener import CANCEL_CHANNEL, CHANNEL, Listener, open_connection
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: Far longer than the test may take: a stop that waited for the end of the listener's
#: current wait would run into the test's time limit.
LONG_WAIT = 3600.0


@pytest.fixture
def notify() -> Iterator:
    """``notify(channel, payload, ...)``: send notifications, committed together."""
    conn = open_connection("default")

    def send(channel: str, *payloads: str) -> None:
        with conn.transaction():
            for payload in payloads:
                conn.execute("SELECT pg_notify(%s, %s)", (channel, payload))

    yield send
    conn.close()


def start_listener(**kwargs) -> Listener:
    listener = Listener("default", ["default"], threading.Event(), timeout=LONG_WAIT, **kwargs)
    listener.start()
    wait_until(listener.connected.is_set, timeout=30, what="the listener to connect")
    return listener


@pytest.mark.timeout(90)
def test_stop_interrupts_the_wait_and_the_thread_has_ended_when_it_returns(notify) -> None:
    listener = start_listener()
    # A notification round trip: the thread has been through its loop and is back waiting.
    listener.wakeup.clear()
    notify(CHANNEL, "default")
    wait_until(listener.wakeup.is_set, timeout=30, what="the notification")

    listener.stop()

    assert not listener._thread.is_alive()
    listener.stop()  # a second stop is harmless


@pytest.mark.timeout(90)
def test_notifications_arriving_together_are_all_handed_on(notify) -> None:
    cancelled: list[int] = []
    listener = start_listener(worker_id="w-1", on_cancel=cancelled.append)
    try:
        listener.wakeup.clear()
        notify(CHANNEL, "elsewhere", "default@3600")
        notify(CANCEL_CHANNEL, "7 w-other", "8 w-1")
        wait_until(lambda: cancelled == [8], timeout=30, what="the cancellation")
        assert listener.wakeup.is_set()
        due = listener.seconds_until_due()
        assert due is not None
        assert 3500 < due <= 3600
    finally:
        listener.stop()
    assert not listener._thread.is_alive()


@pytest.mark.timeout(90)
def test_a_lost_connection_is_replaced(notify) -> None:
    listener = start_listener()
    try:
        with open_connection("default") as admin:
            [pid] = admin.execute(
                "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN pgtasks' "
                "AND pid <> pg_backend_pid() AND datname = current_database()"
            ).fetchone()
            listener.connected.clear()
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_until(listener.connected.is_set, timeout=30, what="the listener to reconnect")
        listener.wakeup.clear()
        notify(CHANNEL, "default")
        wait_until(listener.wakeup.is_set, timeout=30, what="the notification")
    finally:
        listener.stop()
    assert not listener._thread.is_alive()

