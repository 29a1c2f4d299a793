"""The supervisor of ``--processes N``: slots per database, and the pause before restarting
a child that died quickly (``worker/supervisor.py``). Real child processes are tested in
``tests/process/test_run_pgtasks.py``."""

from __future__ import annotations

import pytest

from django_pgtasks.worker.supervisor import MAX_RESTART_PAUSE, QUICK_DEATH, Supervisor


def test_each_set_of_options_gets_its_processes() -> None:
    supervisor = Supervisor(3, [{"using": "default"}, {"using": "queue_a"}], "INFO")
    assert supervisor.processes == 6
    assert [slot["using"] for slot in supervisor.slots] == ["default"] * 3 + ["queue_a"] * 3
    assert Supervisor(2, {"using": "default"}, "INFO").slots == [{"using": "default"}] * 2


def test_a_child_that_keeps_dying_quickly_waits_longer_each_time_up_to_a_bound() -> None:
    supervisor = Supervisor(1, {}, "INFO")
    pauses = [supervisor._restart_pause(0, lived=0.1) for _ in range(10)]
    assert pauses[:6] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    assert pauses[6:] == [MAX_RESTART_PAUSE] * 4


def test_a_child_that_lived_long_enough_restarts_at_once_and_resets_its_count() -> None:
    supervisor = Supervisor(2, {}, "INFO")
    for _ in range(3):
        supervisor._restart_pause(0, lived=1.0)
    assert supervisor._restart_pause(0, lived=QUICK_DEATH) == 0.0
    assert supervisor._restart_pause(0, lived=0.0) == 0.5  # counted afresh


@pytest.mark.parametrize("slot", [0, 1])
def test_slots_are_counted_apart(slot: int) -> None:
    supervisor = Supervisor(2, {}, "INFO")
    for _ in range(4):
        supervisor._restart_pause(1 - slot, lived=0.0)
    assert supervisor._restart_pause(slot, lived=0.0) == 0.5
