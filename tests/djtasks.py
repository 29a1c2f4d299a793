"""A ``django.tasks`` task in a module outside every installed app (``tests`` is not one).

A worker process never imports it because a task's row names it (stored names import only
modules of installed apps): such a task runs only in the process that enqueued it, and fails as
unknown in a worker process (tests/process/test_task_names.py).
"""

from __future__ import annotations

from django_pgtasks.base.compat import task


@task
def multiply(a: int, b: int) -> int:
    return a * b
