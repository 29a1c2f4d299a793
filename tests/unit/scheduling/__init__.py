"""Unit tests of django_pgtasks.scheduling."""
