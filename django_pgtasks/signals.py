"""Signals for telemetry hooks. All are sent with ``sender=Task`` (the model class).

- ``task_enqueued(task)``: after a task row was inserted (inside the caller's transaction;
  use ``transaction.on_commit`` in the receiver for side effects that need the commit).
- ``task_started(task, worker_id)``: in the worker thread, before the handler runs.
- ``task_finished(task, worker_id, status, duration, exception)``: after the outcome is
  recorded; ``exception`` is the handler's exception or ``None``.
"""

from django.dispatch import Signal

task_enqueued = Signal()
task_started = Signal()
task_finished = Signal()
