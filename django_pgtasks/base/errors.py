"""Deprecated: split into :mod:`django_pgtasks.definition.error_text` (the stored texts) and
:mod:`django_pgtasks.database.sqlstates` (which database errors are transient)."""

from typing import Any

from django_pgtasks.base import alias
from django_pgtasks.database import sqlstates

_texts = alias(__name__, "django_pgtasks.definition.error_text")


def __getattr__(name: str) -> Any:
    if hasattr(sqlstates, name):
        return getattr(sqlstates, name)
    return _texts(name)
