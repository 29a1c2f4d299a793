"""The import paths documented before the modules of ``django_pgtasks.base`` moved keep working
for one release, with a ``DeprecationWarning`` that names the new path."""

from __future__ import annotations

import importlib
import sys

import pytest


@pytest.mark.parametrize(
    ("old", "name", "new"),
    [
        ("django_pgtasks.base.registry", "add_resolver", "django_pgtasks.definition.registry"),
        ("django_pgtasks.base.sessions", "open_connection", "django_pgtasks.database.sessions"),
        ("django_pgtasks.base.budget", "connections_needed",
         "django_pgtasks.database.connection_budget"),
        ("django_pgtasks.base.errors", "error_text", "django_pgtasks.definition.error_text"),
        ("django_pgtasks.base.errors", "is_transient", "django_pgtasks.database.sqlstates"),
        ("django_pgtasks.dev", "database_config", "django_pgtasks_dev"),
    ],
)
def test_an_old_path_warns_and_gives_the_same_object(old: str, name: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=r"moved to django_pgtasks"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_an_unknown_name_of_an_old_path_is_an_attribute_error() -> None:
    sys.modules.pop("django_pgtasks.base.registry", None)
    with pytest.warns(DeprecationWarning, match="django_pgtasks.definition.registry"):
        module = importlib.import_module("django_pgtasks.base.registry")
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_add_resolver_is_public_at_the_top() -> None:
    import django_pgtasks
    from django_pgtasks.definition.registry import add_resolver

    assert django_pgtasks.add_resolver is add_resolver
