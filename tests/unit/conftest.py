"""The unit tier: pure Python, no database.

pytest-django refuses database access to every test without the ``django_db`` marker (or a
fixture that asks for the database), and no test here has either: a test that reaches the
database fails with "Database access not allowed". The tier runs with no server at all::

    DATABASE_URL=postgres://postgres@127.0.0.1:1/unreachable python -m pytest tests/unit -n 0
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_pgtasks.definition import registry


@pytest.fixture
def temporary_handlers() -> Iterator[None]:
    """Handlers registered during the test are unregistered after it."""
    before = set(registry._registry)
    yield
    for name in set(registry._registry) - before:
        registry._registry.pop(name)


@pytest.fixture
def pgtasks(settings: Any) -> Callable[..., None]:
    """Set ``PGTASKS`` keys on top of the test settings (restored after the test)."""
    base = dict(settings.PGTASKS)

    def apply(**options: Any) -> None:
        settings.PGTASKS = {**base, **options}

    return apply
