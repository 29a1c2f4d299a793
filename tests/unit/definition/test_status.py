"""The states of a task and their groups (``definition/status.py``): every state is in the
groups the queries rely on, and the groups agree with each other."""

from __future__ import annotations

import pytest

from django_pgtasks.definition.status import FINISHED, LIVE, PENDING, UNSTARTED, Status


def test_every_state_is_waiting_live_or_finished_and_only_one_of_them() -> None:
    groups = [{Status.WAITING}, set(LIVE), set(FINISHED)]
    assert set().union(*groups) == set(Status)
    assert sum(len(group) for group in groups) == len(Status)


def test_a_claimable_state_is_live_and_unstarted() -> None:
    assert set(PENDING) <= set(LIVE)
    assert set(PENDING) <= set(UNSTARTED)


def test_unstarted_is_everything_not_running_that_can_still_run() -> None:
    assert set(UNSTARTED) == set(Status) - set(FINISHED) - {Status.RUNNING}


@pytest.mark.parametrize("status", list(Status))
def test_the_stored_value_is_the_states_name(status: Status) -> None:
    """The values are public API, stored as they are and matched by name in SQL."""
    assert status.value == status.name
    assert Status(status.name) is status
