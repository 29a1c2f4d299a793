"""Deprecated: moved to :mod:`django_pgtasks.definition.registry`."""

from django_pgtasks.base import alias

__getattr__ = alias(__name__, "django_pgtasks.definition.registry")
