"""The unit tier: pure Python, no database.

pytest-django refuses database access to every test without the ``django_db`` marker (or a
fixture that asks for the database), and no test here has either: a test that reaches for
the database fails with "Database access not allowed". The tier needs no server at all, and
with ``PGTASKS_EMBEDDED=0`` the settings start none (not even the tests' second server)::

    PGTASKS_EMBEDDED=0 python -m pytest tests/unit -n 0

CI runs it with ``DATABASE_URL`` pointing at a closed port as well (``.ci/run``)."""

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
