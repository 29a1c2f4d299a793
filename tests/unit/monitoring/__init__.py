"""Unit tests of django_pgtasks.monitoring."""
