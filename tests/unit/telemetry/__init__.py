"""Unit tests of django_pgtasks.telemetry."""
