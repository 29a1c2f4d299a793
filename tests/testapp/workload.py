"""Simulated work for the handlers of the test app."""

from __future__ import annotations

import time


def pause(seconds: float) -> None:
    """Keep the calling handler busy for ``seconds``, as real work would (uninterruptibly:
    a time limit or a cancellation cannot cut it short).

    Workload, not a wait a test depends on: the tests wait for events they observe
    (``tests.helpers.wait_until``). The one place a handler of the test app sleeps.
    """
    time.sleep(seconds)
