"""The worker: what ``manage.py run_pgtasks`` runs.

:mod:`.loop` (wait, claim, submit, record: the ``Worker`` that holds the other parts),
:mod:`.executor` (one task on a pool thread), :mod:`.pool` (the handler threads),
:mod:`.prefetch` (how much to claim), :mod:`.completion` (outcomes handed back to the loop),
:mod:`.watchdog` and :mod:`.listener` (heartbeats, cancellations, time limits, wake-ups),
:mod:`.liveness` (registration, rescue) and :mod:`.supervisor` (several processes).
"""

from typing import Any

__all__ = ["Worker"]


def __getattr__(name: str) -> Any:
    # ``Worker`` is imported on first use: the supervisor's child processes import this
    # package (to unpickle their entry point) before Django's apps, and so the models, load.
    if name == "Worker":
        from django_pgtasks.worker.loop import Worker

        return Worker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
