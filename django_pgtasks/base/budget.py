"""Deprecated: moved to :mod:`django_pgtasks.database.connection_budget`."""

from django_pgtasks.base import alias

__getattr__ = alias(__name__, "django_pgtasks.database.connection_budget")
