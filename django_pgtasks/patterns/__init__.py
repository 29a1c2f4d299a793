"""Patterns: queue controls (pauses, rate limits) and retention of finished tasks.

Jobs the worker runs and functions the admin and the commands call; nothing here imports the
worker or the admin.
"""
