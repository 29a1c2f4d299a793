"""A ``django.tasks`` task in a module outside every installed app (``tests`` is not one).

A worker imports this module only because the task's row names it; the native registry's
on-demand import covers installed apps only.
"""

from __future__ import annotations

from django_pgtasks.compat import task


@task
def multiply(a: int, b: int) -> int:
    return a * b
