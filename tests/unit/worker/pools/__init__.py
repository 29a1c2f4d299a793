"""Unit tests of django_pgtasks.worker.pools."""
