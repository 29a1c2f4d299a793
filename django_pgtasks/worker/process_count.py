"""How many worker processes ``run_pgtasks`` starts per database when ``--processes`` is not
given: ``PGTASKS["PROCESSES"]``, a number or ``"auto"`` (the default).

A worker process runs Python, and Python runs one thread at a time (the GIL): one process uses
about one CPU, however many threads it has. ``"auto"`` starts one per CPU this process may
use, so that the default worker uses the machine it is given (as Celery's default
``--concurrency`` does):

- the CPUs it may run on (``os.sched_getaffinity``: ``taskset``, a container's ``cpuset``);
- fewer when the cgroup (v2) gives it a CPU quota (``cpu.max``, what a container's
  ``--cpus`` or a Kubernetes CPU limit sets): the quota rounded up.

Then ``run_pgtasks`` lowers an ``"auto"`` count to what the database's connection budget
accepts (:mod:`django_pgtasks.database.connection_budget`), never below one; a number given
explicitly is kept, with the budget's warning.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

#: The cgroup v2 file that holds this process's CPU quota ("max 100000": none; "150000
#: 100000": 1.5 CPUs), when the cgroup file system is mounted at the usual place.
CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def quota_cpus(text: str) -> int | None:
    """The CPUs a cgroup v2 ``cpu.max`` content allows, rounded up (``None``: no quota)."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def usable_cpus(cpu_max: Path = CPU_MAX) -> int:
    """The CPUs this process may use: those it may run on, capped by its cgroup's quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        quota = quota_cpus(cpu_max.read_text())
    except OSError:
        quota = None
    return max(1, min(cpus, quota) if quota else cpus)


def default_processes(setting: int | str) -> int:
    """The number of worker processes ``PGTASKS["PROCESSES"]`` asks for."""
    return usable_cpus() if setting == "auto" else int(setting)
