"""How many worker processes PROCESSES "auto" asks for: the CPUs the command may use."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from django_pgtasks.worker.process_count import default_processes, quota_cpus, usable_cpus


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("max 100000\n", None),  # no quota
        ("200000 100000\n", 2),
        ("150000 100000", 2),  # 1.5 CPUs: a second process gets the half
        ("50000 100000", 1),  # half a CPU: still one process
        ("100000 100000", 1),
        ("", None),
        ("garbage", None),
        ("-1 100000", None),
        ("100000 0", None),
    ],
)
def test_a_cgroup_quota_is_rounded_up_to_whole_cpus(text: str, cpus: int | None) -> None:
    assert quota_cpus(text) == cpus


def test_usable_cpus_are_those_the_process_may_run_on(tmp_path: Path) -> None:
    allowed = len(os.sched_getaffinity(0))
    assert usable_cpus(tmp_path / "missing") == allowed  # no cgroup file: the affinity
    unlimited = tmp_path / "cpu.max"
    unlimited.write_text("max 100000\n")
    assert usable_cpus(unlimited) == allowed


def test_a_cgroup_quota_caps_the_usable_cpus(tmp_path: Path) -> None:
    quota = tmp_path / "cpu.max"
    quota.write_text("100000 100000\n")
    assert usable_cpus(quota) == 1
    quota.write_text(f"{1000 * 100000} 100000\n")  # more than the machine has: the affinity
    assert usable_cpus(quota) == len(os.sched_getaffinity(0))


def test_the_setting_gives_the_number_of_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_pgtasks.worker import process_count

    monkeypatch.setattr(process_count, "usable_cpus", lambda: 6)
    assert default_processes("auto") == 6
    assert default_processes(3) == 3
