"""Tests that start `manage.py` processes (workers, the demo, the docs' commands)."""
