"""Simulated work for the handlers of the test app."""

from __future__ import annotations

import asyncio
import time


def pause(seconds: float) -> None:
    """Keep the calling handler busy for ``seconds``, as real work would (uninterruptibly:
    a time limit or a cancellation cannot cut it short).

    Workload, not a wait a test depends on: the tests wait for events they observe
    (``tests.helpers.wait_until``). The one place a handler of the test app sleeps.
    """
    time.sleep(seconds)


def wait_for_gate(gate: str, timeout: float = 600.0) -> None:
    """Keep the calling handler busy until the file ``gate`` exists (a test opens the gate
    once it has seen what it waits for while the handler runs); ``TimeoutError`` after
    ``timeout`` seconds."""
    import os

    deadline = time.monotonic() + timeout
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{gate} did not appear within {timeout}s.")
        pause(0.01)


async def wait_on_io(seconds: float) -> None:
    """Keep the calling coroutine waiting ``seconds``, as real I/O would (without blocking its
    event loop; a time limit or a cancellation cuts it short).

    Workload, not a wait a test depends on. The one place a coroutine of the test app
    sleeps."""
    await asyncio.sleep(seconds)
