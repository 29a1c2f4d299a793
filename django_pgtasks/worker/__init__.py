"""The worker: what ``manage.py run_pgtasks`` runs.

:mod:`.loop` (wait, claim, submit), :mod:`.pool` (the handler threads), :mod:`.completion`
(outcomes handed back to the loop), :mod:`.listener` (wake-ups and the watchdog),
:mod:`.liveness` (registration, heartbeat, rescue) and :mod:`.supervisor` (several processes).
"""

from django_pgtasks.worker.loop import Worker

__all__ = ["Worker"]
