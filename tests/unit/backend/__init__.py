"""Unit tests of django_pgtasks.backend."""
