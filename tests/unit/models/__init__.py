"""Unit tests of django_pgtasks.models: what the manager decides before any SQL."""
