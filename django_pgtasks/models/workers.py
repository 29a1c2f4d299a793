"""The worker processes that are running now, one row each."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _


class WorkerProcess(models.Model):
    """A running worker process, registered while it runs (see
    :mod:`django_pgtasks.worker.liveness`).

    ``id`` doubles as the key of the session-level advisory lock the worker holds on its
    liveness connection; ``last_seen_at`` is refreshed by its heartbeat.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(_("worker id"), max_length=255, unique=True)
    hostname = models.CharField(_("host"), max_length=255)
    pid = models.PositiveIntegerField(_("process id"))
    queues = models.JSONField(_("queues"), default=list)
    concurrency = models.PositiveIntegerField(_("threads"))
    backend_pid = models.PositiveIntegerField(
        _("database backend pid"), null=True, blank=True,
        help_text=_("Backend process of the worker's liveness connection."),
    )
    lock_key = models.IntegerField(
        _("liveness lock key"), null=True, blank=True,
        help_text=_("Second key of the advisory lock the worker holds; empty when it proves "
                    "its liveness by heartbeats only."),
    )
    started_at = models.DateTimeField(_("started"), db_default=Now())
    last_seen_at = models.DateTimeField(_("last seen"), db_default=Now())

    class Meta:
        db_table = "pgtasks_worker"
        verbose_name = _("worker")
        verbose_name_plural = _("workers")

    def __str__(self) -> str:
        return self.name
