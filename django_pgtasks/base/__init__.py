"""Deprecated import paths, kept for one release.

The modules of ``django_pgtasks.base`` moved in 0.1 to folders named for what they hold:
:mod:`django_pgtasks.definition` (what a task is), :mod:`django_pgtasks.database` (how the
queue talks to PostgreSQL) and :mod:`django_pgtasks.telemetry`. The documented names of the old
paths still work through the aliases here, with a ``DeprecationWarning``; they will be removed
in 0.3.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def alias(old: str, new: str) -> Callable[[str], Any]:
    """Warn that module ``old`` moved to ``new``, and give ``old`` a module ``__getattr__`` that
    reads every name from ``new``."""
    warnings.warn(
        f"{old} moved to {new}; the old path will be removed in django-pgtasks 0.3.",
        DeprecationWarning,
        stacklevel=3,
    )
    module = importlib.import_module(new)

    def __getattr__(name: str) -> Any:
        return getattr(module, name)

    return __getattr__
