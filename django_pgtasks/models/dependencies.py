"""Dependencies between tasks: which task waits for which, and the workflows they form.

A task enqueued with parents (``depends_on``, or as a step of a chain or the callback of a
group: :mod:`django_pgtasks.workflows`) starts ``WAITING``, outside the claim
index's range. It has one :class:`Dependency` row per parent and one :class:`WorkflowMember`
row that counts the parents that have not ended yet (``remaining``).

A parent's end, whatever ends it (a worker's outcome, the rescue, a cancel, an operator's
action, a deletion), leaves a :class:`PendingRelease` mark in its own transaction: a trigger
on the task table (``sql/workflows.sql``) fires only for rows with ``has_dependents`` that
end. The workers then release the children in bounded batches
(:mod:`django_pgtasks.lifecycle.release`): each edge records how its parent ended and is
counted off its child (the member rows serialize concurrent releases of one child's parents),
and each child left with none is settled: ``READY``, or by its ``on_parent_failure`` policy
``CANCELLED`` (skip) or ``FAILED`` (fail) when a parent did not succeed — an end that leaves
a mark for its own children in turn. A parent that is requeued after it ended re-opens its
whole downstream.

Why a child never misses a parent's end, although it may be enqueued while that parent is
finishing on a worker, with neither transaction seeing the other's writes: a deferred
constraint trigger on the member row of a child with such parents (``outside_parents``:
parents enqueued in the same transaction cannot end before it commits) runs at the enqueuing
transaction's commit. It locks
the parents still counted (in id order), flags them ``has_dependents``, and counts off those
that ended meanwhile; a parent found pending is locked once per transaction, not once per
child. A worker ending one of those parents either ended it before (seen here,
under the lock) or waits for this commit, microseconds away, and its mark then finds the
committed edges (a release reads them with a fresh snapshot). The web request that enqueues
is never waited for during its transaction, only at its commit.
"""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class OnParentFailure(models.TextChoices):
    """What a task does when a task it depends on did not succeed (failed, was cancelled
    or skipped, or was deleted before it ended)."""

    #: Run anyway (a group's callback, which receives every member's outcome).
    RUN = "run", _("run anyway")
    #: Do not run: end ``CANCELLED``, naming the parent (the default of ``depends_on`` and
    #: chains); its own children see a parent that did not succeed.
    SKIP = "skip", _("skip (cancelled)")
    #: Do not run: end ``FAILED``, naming the parent.
    FAIL = "fail", _("fail")


class WorkflowMember(models.Model):
    """A task that belongs to a workflow, and how many of its parents have not ended yet."""

    task = models.OneToOneField(
        "django_pgtasks.Task", on_delete=models.CASCADE, primary_key=True,
        related_name="workflow_member", db_constraint=False,
    )
    workflow_id = models.UUIDField(_("workflow"), db_index=True)
    remaining = models.IntegerField(
        _("parents not ended"), default=0,
        help_text=_("Parents that have not ended yet; the task is released at zero."),
    )
    outside_parents = models.BooleanField(
        _("waits for earlier tasks"), default=False, db_default=False,
        help_text=_("Some of its parents existed before it was enqueued: they are checked "
                    "again at the enqueuing transaction's commit."),
    )
    on_parent_failure = models.CharField(
        _("if a parent does not succeed"), max_length=8, choices=OnParentFailure.choices,
        default=OnParentFailure.SKIP,
    )
    created_at = models.DateTimeField(_("created"), auto_now_add=True)

    class Meta:
        db_table = "pgtasks_workflow_member"
        verbose_name = _("workflow member")
        verbose_name_plural = _("workflow members")

    def __str__(self) -> str:
        return f"task #{self.task_id} of workflow {self.workflow_id}"


class Dependency(models.Model):
    """One edge: ``child`` runs only after ``parent`` ended (``resolved``), and how it ended."""

    child = models.ForeignKey(
        "django_pgtasks.Task", on_delete=models.CASCADE, related_name="dependencies",
        db_constraint=False, db_index=False,  # the unique constraint's index leads with it
    )
    #: Indexed: the edges a parent's end resolves and its re-opening finds. No foreign key
    #: constraint: a parent may be purged after it ended while its children keep the
    #: record of how it ended (``parent_status``).
    parent = models.ForeignKey(
        "django_pgtasks.Task", on_delete=models.DO_NOTHING, related_name="dependents",
        db_constraint=False,
    )
    resolved = models.BooleanField(_("parent ended"), default=False)
    parent_status = models.CharField(
        _("how the parent ended"), max_length=16, null=True, blank=True,
        help_text=_("SUCCESSFUL, FAILED or CANCELLED; DELETED for a parent deleted before "
                    "it ended."),
    )

    class Meta:
        db_table = "pgtasks_dependency"
        verbose_name = _("dependency")
        verbose_name_plural = _("dependencies")
        constraints = [
            models.UniqueConstraint(fields=["child", "parent"], name="pgtasks_dependency_uniq"),
        ]
        indexes = [
            # The edges a release still has to resolve (migration 0017).
            models.Index(fields=["parent"], condition=models.Q(resolved=False),
                         name="pgtasks_dependency_open_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.child_id} after #{self.parent_id}"


class PendingRelease(models.Model):
    """A task with dependents that ended (or was deleted before it ended) and whose edges are
    not all resolved yet: the workers release its children in bounded batches
    (:mod:`django_pgtasks.lifecycle.release`). Written by the database when the task ends."""

    #: Not a foreign key: the ended task may be purged before its release is done.
    parent_id = models.BigIntegerField(_("ended task"), primary_key=True)
    parent_status = models.CharField(
        _("how it ended"), max_length=16,
        help_text=_("SUCCESSFUL, FAILED or CANCELLED; DELETED for a task deleted before it "
                    "ended."),
    )
    created_at = models.DateTimeField(_("ended at"))
    due_at = models.DateTimeField(
        _("next try"), help_text=_("A release that failed is tried again from this time."))
    failures = models.IntegerField(_("failed tries"), default=0)
    last_error = models.TextField(_("last error"), blank=True, default="")

    class Meta:
        db_table = "pgtasks_pending_release"
        verbose_name = _("pending release")
        verbose_name_plural = _("pending releases")
        indexes = [models.Index(fields=["due_at"], name="pgtasks_release_due_idx")]

    def __str__(self) -> str:
        return f"release of the dependents of #{self.parent_id}"
