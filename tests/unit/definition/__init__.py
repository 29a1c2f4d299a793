"""Unit tests of django_pgtasks.definition."""
