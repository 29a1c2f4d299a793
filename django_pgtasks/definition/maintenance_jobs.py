"""Periodic jobs that run inside the workers, on their maintainer thread (never on the claim
path: :mod:`django_pgtasks.worker.maintainer`).

Rescue of abandoned tasks is one; the scheduler of periodic tasks and the purge of old tasks
register theirs the same way. Each job decides how often it runs (read from settings at each
turn, so tests can change them) and takes care of its own mutual exclusion across workers,
typically with ``pg_try_advisory_xact_lock(LOCK_NAMESPACE, <job key>)`` so that one worker at
a time does the work and the others skip that turn.

A worker runs every job against its own database (``run(alias)``): with queues on several
databases (:mod:`django_pgtasks.definition.routing`), each database is rescued, purged and
scheduled by its own workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Job:
    #: Shown in logs.
    name: str
    #: Seconds between two runs in one worker; ``None`` or ``0`` disables the job.
    interval: Callable[[], float | None]
    #: Does one turn of the work against the given database alias, on the maintainer's
    #: thread and connection (``connections[alias]`` there). Database errors are caught,
    #: logged and retried at the next turn by the worker; a lock the job cannot get soon is
    #: better given up (the maintainer's ``lock_timeout``) than waited for.
    run: Callable[[str], object]


_jobs: dict[str, Job] = {}


def register(job: Job) -> Job:
    """Add (or replace) a job run by every worker."""
    _jobs[job.name] = job
    return job


def jobs() -> list[Job]:
    return list(_jobs.values())
