"""The backend's exceptions. Their path is ``django_pgtasks.backend``: stored error texts
name them by it."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django_pgtasks.definition.framework import (
    InvalidTask,
)
from django_pgtasks.exceptions import (
    InvalidPayloadError,
    UnstorableResultError,
)

if TYPE_CHECKING:
    pass


logger = logging.getLogger("django_pgtasks.backend")

class InvalidTaskArguments(InvalidTask, InvalidPayloadError):
    """Task arguments that would not come back unchanged from JSON, or that PostgreSQL would
    refuse; nothing was enqueued.

    Django's ``InvalidTask``, and the ``InvalidPayloadError`` that ``@pgtask`` handlers
    raise for the same arguments (a ``TypeError``, as Django raises for arguments that cannot
    be serialized, and a ``ValueError``).
    """

    __module__ = "django_pgtasks.backend"


class InvalidReturnValue(UnstorableResultError):
    """A task returned something PostgreSQL cannot store unchanged as its result; the task
    fails without a retry (an ``UnstorableResultError``: a ``FatalError`` and a
    ``TypeError``)."""

    __module__ = "django_pgtasks.backend"
