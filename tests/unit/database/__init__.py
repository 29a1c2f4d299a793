"""Unit tests of django_pgtasks.database."""
