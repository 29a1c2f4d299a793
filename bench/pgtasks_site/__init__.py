"""A minimal Django project for the benchmark's django-pgtasks workers (see settings.py)."""
