"""Model fields of the package's own."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _


class TimestampArrayField(models.Field):
    """A PostgreSQL ``timestamptz[]`` column, read and written as a list of datetimes.

    Just enough for the record of recent starts, which only SQL (the claim) interprets; it
    spares projects from adding ``django.contrib.postgres`` to ``INSTALLED_APPS``.
    """

    description = _("List of timestamps")

    def db_type(self, connection: Any) -> str:
        return "timestamp with time zone[]"

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        return None if value is None else list(value)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        return value

    def to_python(self, value: Any) -> Any:
        return value
