"""Unit tests of django_pgtasks.management: the commands' options, before any query."""
