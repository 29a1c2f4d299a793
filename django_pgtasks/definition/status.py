"""The states of a task and the groups of states the queries use."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class Status(models.TextChoices):
    """Task states. The values are public API and stored as-is."""

    #: Waiting for the tasks it depends on to end (a workflow member); not claimable until
    #: the end of the last one releases it (django_pgtasks.models.dependencies).
    WAITING = "WAITING", _("Waiting for parents")
    #: Waiting to run (possibly not before ``run_after``).
    READY = "READY", _("Ready")
    #: Claimed by a worker and running now.
    RUNNING = "RUNNING", _("Running")
    #: An attempt failed; the next one may start at ``run_after``.
    AWAITING_RETRY = "AWAITING_RETRY", _("Awaiting retry")
    #: Finished without error.
    SUCCESSFUL = "SUCCESSFUL", _("Successful")
    #: Failed for good: attempts exhausted, a fatal error, or an unknown task.
    FAILED = "FAILED", _("Failed")
    #: Withdrawn before it ran; never runs.
    CANCELLED = "CANCELLED", _("Cancelled")


#: States a worker may claim from (when ``run_after`` has passed).
PENDING = (Status.READY, Status.AWAITING_RETRY)
#: Not finished and not running: what an operator's cancel ends at once.
UNSTARTED = (Status.WAITING, Status.READY, Status.AWAITING_RETRY)
#: Waiting or running: a key can have at most one task in these states.
LIVE = (Status.READY, Status.AWAITING_RETRY, Status.RUNNING)
#: End states: the task never runs again unless an operator requeues it.
FINISHED = (Status.SUCCESSFUL, Status.FAILED, Status.CANCELLED)

#: The claim order. The partial index ``pgtasks_task_claim_idx`` has exactly these columns
#: after ``queue`` and exactly the claim's status predicate, so a claim reads the first rows
#: of one index range however many finished rows or future tasks the table holds.
CLAIM_ORDER = ("-priority", "run_after", "id")
