"""A ``django.tasks`` task in the project's own package, outside every installed app.

``tests`` is the package of the settings module (``tests.settings``) and of ``ROOT_URLCONF``,
as ``mysite`` is for a project made by ``startproject``: a worker process imports this module
when a row names its task (tests/process/test_task_names.py).
"""

from __future__ import annotations

from django_pgtasks.definition.framework import task


@task
def multiply(a: int, b: int) -> int:
    return a * b
