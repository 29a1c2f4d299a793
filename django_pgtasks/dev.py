"""Deprecated: the development database helpers moved to :mod:`django_pgtasks_dev`, out of the
runtime package."""

from django_pgtasks.base import alias

__getattr__ = alias(__name__, "django_pgtasks_dev")
