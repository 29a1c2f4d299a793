"""Unit tests of django_pgtasks.lifecycle."""
