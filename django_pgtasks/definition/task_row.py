"""What the lower layers read of a task row, as a type (the table lives in the models).

The handler code in :mod:`django_pgtasks.definition` and the statements of
:mod:`django_pgtasks.lifecycle` sit below the models and never import them; they take any
object with these attributes, which :class:`~django_pgtasks.models.Task` is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol


class TaskRow(Protocol):
    """A task as the handlers and the transitions see it."""

    pk: Any
    #: The same value as ``pk``, as a plain attribute: what the paths every task takes read.
    id: int
    name: str
    queue: str
    args: Any
    kwargs: Any
    priority: int
    status: str
    attempt: int
    max_attempts: int
    run_after: datetime
    metadata: Any
    result: Any
    #: The steps that completed (context.step()): entries of django_pgtasks.definition.steps.
    steps: Any
    error_text: str
    key: str | None
    locked_by: str | None
    #: The lease: the number of the claim this run holds.
    claims: int
