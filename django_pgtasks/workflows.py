"""Workflows: chains, groups with a callback, and dependencies between tasks.

The public names of :mod:`django_pgtasks.patterns.workflows`; see ``docs/howto/workflows.md``.
``Task.objects.enqueue(..., depends_on=[...])`` makes one task wait for others.
"""

from django_pgtasks.lifecycle.dependencies import ParentOutcome
from django_pgtasks.patterns.workflows import Flow, Workflow, cancel, chain, group, members

__all__ = ["Flow", "ParentOutcome", "Workflow", "cancel", "chain", "group", "members"]
