"""Fixtures of the chaos tests."""

from __future__ import annotations

import pytest

#: Seconds of silence after which the workers of a test that terminates live workers'
#: sessions count as lost once their lock is gone (PGTASKS["RESCUE_GRACE"]; 1 s elsewhere
#: in the tests). A terminated worker's watchdog reconnects and heartbeats again at once; on a
#: loaded machine that can take more than a second, and a rescue of its tasks meanwhile would
#: run them twice behind a live worker's back. Production's grace (5 s by default) is meant
#: to be longer than the reconnections its workers ride out; so is this one.
SESSIONS_TERMINATED_GRACE = 3.0


@pytest.fixture
def sessions_terminated(subprocess_env: dict[str, str]) -> None:
    """The worker processes the test starts get the rescue grace of
    :data:`SESSIONS_TERMINATED_GRACE` (``PGTASKS_TEST_RESCUE_GRACE``, read by
    ``tests/settings.py``)."""
    subprocess_env["PGTASKS_TEST_RESCUE_GRACE"] = str(SESSIONS_TERMINATED_GRACE)
