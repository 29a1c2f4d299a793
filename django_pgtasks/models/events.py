"""Events that durable tasks wait for (``context.wait_for_event()``), by key."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from django_pgtasks.definition.events import MAX_EVENT_KEY


class Event(models.Model):
    """An event sent with ``Task.objects.send_event(key, payload)``: the last payload sent
    under each key, kept until deleted (``PGTASKS["EVENT_RETENTION"]``). A task that waits
    for the key gets the payload, whether the event was sent before or after its wait
    began."""

    key = models.CharField(_("key"), max_length=MAX_EVENT_KEY, primary_key=True)
    payload = models.JSONField(_("payload"), null=True, blank=True)
    sent_at = models.DateTimeField(_("sent"), db_default=Now())

    class Meta:
        db_table = "pgtasks_event"
        verbose_name = _("event")
        verbose_name_plural = _("events")
        indexes = [models.Index(fields=["sent_at"], name="pgtasks_event_sent_idx")]

    def __str__(self) -> str:
        return self.key
