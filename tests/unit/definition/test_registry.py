"""The registry (``definition/registry.py``): ``@pgtask`` and its checks at import time, names
mapped to handlers, and which modules a stored name may import.

A module that fails to import, seen through a stored name, is tested in
``tests/process/test_task_names.py``."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_pgtasks import pgtask
from django_pgtasks.definition import registry
from django_pgtasks.definition.handlers import TaskHandler
from django_pgtasks.definition.recurrence import Cron
from django_pgtasks.definition.registry import (
    MAX_NAME_LENGTH,
    add_resolver,
    get_handler,
    importable_prefixes,
    installed_module_of,
    project_packages,
    register,
)
from django_pgtasks.exceptions import InvalidTaskError, UnknownTaskError
from tests.testapp import tasks

pytestmark = pytest.mark.usefixtures("temporary_handlers")


def first() -> None:
    pass


def second() -> None:
    pass


@pytest.fixture
def resolvers() -> Iterator[list]:
    """Resolvers added during the test are removed after it."""
    before = list(registry._resolvers)
    yield registry._resolvers
    registry._resolvers[:] = before


# -- @pgtask --------------------------------------------------------------------------------


def test_the_default_name_is_the_module_and_qualified_name() -> None:
    handler = pgtask(first)
    assert handler.name == f"{__name__}.first"
    assert get_handler(handler.name) is handler


def test_the_decorators_options_are_kept_on_the_handler() -> None:
    handler = pgtask(name="tests.unit.options", queue="emails", priority=150, max_attempts=7,
                     backoff="linear", fatal=[KeyError], atomic=True, context=True, timeout=2,
                     schedule="*/5 * * * *", concurrency_key="k",
                     concurrency_limit=2)(first)
    assert (handler.queue, handler.priority, handler.max_attempts, handler.backoff) == (
        "emails", 150, 7, "linear")
    assert handler.fatal == (KeyError,)  # any iterable, kept as a tuple
    assert handler.atomic
    assert handler.takes_context
    assert handler.timeout == 2
    assert handler.schedule == Cron("*/5 * * * *")  # parsed once, at import time
    assert (handler.concurrency_key, handler.concurrency_limit) == ("k", 2)
    assert pgtask(name="tests.unit.every", schedule=90)(second).schedule.spec == "every 1m30s"


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"priority": 201}, InvalidTaskError, "Priority must be an integer from 0 to 200"),
    ({"max_attempts": 0}, InvalidTaskError, "max_attempts must be an integer from 1 to 1000"),
    ({"timeout": 0}, ImproperlyConfigured, "timeout must be a positive number of seconds, not 0."),
    ({"timeout": -1.5}, ImproperlyConfigured, "not -1.5."),
    ({"timeout": True}, ImproperlyConfigured, "not True."),
    ({"timeout": "10"}, ImproperlyConfigured, "not '10'."),
    ({"backoff": "fibonacci"}, ValueError, "Unknown backoff policy 'fibonacci'"),
    ({"concurrency_key": 5}, ImproperlyConfigured,
     "concurrency_key must be a string or a callable, not 5."),
    ({"concurrency_limit": 0}, ImproperlyConfigured,
     "concurrency_limit must be an integer from 1 to 32767, not 0."),
    ({"concurrency_limit": 32768}, ImproperlyConfigured, "not 32768."),
    ({"concurrency_limit": False}, ImproperlyConfigured, "not False."),
    ({"schedule": "61 * * * *"}, ImproperlyConfigured, "Invalid cron expression"),
])
def test_invalid_options_fail_when_the_decorator_runs_and_register_nothing(
    options: dict, error: type[Exception], message: str,
) -> None:
    with pytest.raises(error, match=re.escape(message)):
        pgtask(name="tests.unit.invalid", **options)(first)
    assert "tests.unit.invalid" not in registry.registered_names()


@pytest.mark.parametrize("name", ["", "x" * (MAX_NAME_LENGTH + 1)])
def test_a_name_must_fit_its_column(name: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=f"must be 1 to {MAX_NAME_LENGTH} characters"):
        register(TaskHandler(func=first, name=name))


def test_the_longest_name_is_accepted() -> None:
    name = "x" * MAX_NAME_LENGTH
    assert register(TaskHandler(func=first, name=name)) is get_handler(name)


def test_one_name_for_two_functions_is_refused_naming_the_first() -> None:
    pgtask(name="tests.unit.twice")(first)
    with pytest.raises(ImproperlyConfigured, match=re.escape(
            f"Task name 'tests.unit.twice' is already registered for {__name__}.first; pass "
            f"a distinct name= to @pgtask.")):
        pgtask(name="tests.unit.twice")(second)
    assert get_handler("tests.unit.twice").func is first


def test_the_same_function_registered_again_replaces_its_handler() -> None:
    """As when a module is imported a second time (a reload, a failed import retried)."""
    old = pgtask(name="tests.unit.again")(first)
    new = pgtask(name="tests.unit.again", priority=5)(first)
    assert get_handler("tests.unit.again") is new is not old


def test_registered_names_are_sorted() -> None:
    pgtask(name="zz.last")(first)
    pgtask(name="aa.first")(second)
    names = registry.registered_names()
    assert names == sorted(names)
    assert {"aa.first", "zz.last"} <= set(names)


# -- finding a handler by name ----------------------------------------------------------------


def test_an_unknown_name_in_an_installed_module_is_unknown() -> None:
    with pytest.raises(UnknownTaskError, match=re.escape(
            "No task handler is registered under the name 'tests.testapp.tasks.not_there'; "
            "decorate the function with @pgtask and make sure its module is imported.")):
        get_handler("tests.testapp.tasks.not_there")


@pytest.mark.parametrize("name", ["this.s", "antigravity.fly", "os.path.join"])
def test_a_name_outside_the_importable_modules_says_why_it_was_not_imported(name: str) -> None:
    module = name.rpartition(".")[0]
    with pytest.raises(UnknownTaskError, match=re.escape(
            f"Only modules of installed apps, of the project's package and of "
            f"PGTASKS['TASK_MODULES'] are imported by name, and {module!r} is none of them.")):
        get_handler(name)


@pytest.mark.parametrize("name", ["", "no_dots", "bad name.f", "1x.f"])
def test_a_name_that_is_no_module_path_is_unknown_without_the_explanation(name: str) -> None:
    with pytest.raises(UnknownTaskError) as excinfo:
        get_handler(name)
    assert "are imported by name" not in str(excinfo.value)


def test_unknown_names_are_lookup_and_value_errors() -> None:
    with pytest.raises(LookupError):
        get_handler("nowhere.at_all")
    with pytest.raises(ValueError, match="No task handler"):  # an InvalidTaskError
        get_handler("nowhere.at_all")


def test_a_resolver_is_asked_about_names_not_registered(resolvers: list) -> None:
    asked: list[str] = []
    made = TaskHandler(func=first, name="adapter.first")

    def resolver(name: str) -> TaskHandler | None:
        asked.append(name)
        return made if name == "adapter.first" else None

    add_resolver(resolver)
    add_resolver(resolver)  # once only
    assert resolvers.count(resolver) == 1
    assert get_handler("adapter.first") is made
    assert get_handler(tasks.add.name) is tasks.add  # registered: no resolver asked
    with pytest.raises(UnknownTaskError):
        get_handler("adapter.other")
    assert asked == ["adapter.first", "adapter.other"]


@pytest.fixture
def unimported() -> Iterator[str]:
    """``tests.testapp.cooperative`` as if never imported; the module and its handlers are
    put back afterwards (other tests hold them)."""
    module = "tests.testapp.cooperative"
    package = sys.modules["tests.testapp"]
    saved_module = sys.modules.pop(module, None)
    saved_attribute = vars(package).pop("cooperative", None)
    saved = {n: h for n, h in registry._registry.items() if n.startswith(module + ".")}
    for name in saved:
        del registry._registry[name]
    yield module
    for name in [n for n in registry._registry if n.startswith(module + ".")]:
        del registry._registry[name]
    registry._registry.update(saved)
    if saved_module is not None:
        sys.modules[module] = saved_module
        package.cooperative = saved_attribute
    else:
        sys.modules.pop(module, None)
        vars(package).pop("cooperative", None)


def test_a_stored_name_imports_its_module_of_an_installed_app(unimported: str) -> None:
    handler = get_handler(f"{unimported}.quick")
    assert unimported in sys.modules
    assert handler.name == f"{unimported}.quick"
    assert handler.takes_context


# -- which modules a stored name may import ---------------------------------------------------


@pytest.mark.parametrize(("name", "module"), [
    ("tests.testapp.tasks.add", "tests.testapp.tasks"),  # an installed app's module
    ("tests.testapp.add", "tests.testapp"),
    ("django_pgtasks.anything.f", "django_pgtasks.anything"),
    ("tests.helpers.f", "tests.helpers"),  # the project's package (tests.settings)
    ("django.contrib.auth.tasks.f", "django.contrib.auth.tasks"),  # an installed app too
    ("this.s", None),
    ("antigravity.fly", None),
    ("os.system", None),
    ("testsx.f", None),  # a prefix must end at a dot
    ("tests.testapp.tasks.1bad", None),
    ("tests.testapp.tasks.", None),
    ("tests..f", None),
    ("add", None),
    ("", None),
])
def test_installed_module_of_imports_nothing_and_says_which_module(
    name: str, module: str | None,
) -> None:
    assert installed_module_of(name) == module


def test_task_modules_add_prefixes_and_malformed_ones_are_ignored(pgtasks) -> None:
    pgtasks(TASK_MODULES=["shared.jobs", "bad prefix", None, "ok."])
    assert installed_module_of("shared.jobs.mail.send") == "shared.jobs.mail"
    assert installed_module_of("shared.jobs.send") == "shared.jobs"
    assert installed_module_of("shared.other.send") is None
    assert installed_module_of("bad prefix.send") is None
    prefixes = importable_prefixes()
    assert "shared.jobs" in prefixes
    assert "bad prefix" not in prefixes
    assert None not in prefixes
    assert "ok." not in prefixes


def test_task_modules_that_is_not_a_list_adds_nothing(pgtasks) -> None:
    pgtasks(TASK_MODULES="shared.jobs")
    assert installed_module_of("shared.jobs.send") is None


@pytest.mark.parametrize(("settings_module", "urlconf", "packages"), [
    ("tests.settings", "tests.urls", ["tests"]),
    ("mysite.settings", "mysite.urls", ["mysite"]),
    ("mysite.settings.prod", "api.urls", ["mysite", "api"]),
    ("settings", "urls", []),  # top-level modules: no package
])
def test_the_project_packages_come_from_the_settings_and_urlconf(
    settings: Any, settings_module: str, urlconf: str, packages: list[str],
) -> None:
    settings.ROOT_URLCONF = urlconf
    # Last: a settings override made after it would hide it (Django's UserSettingsHolder has
    # a class attribute SETTINGS_MODULE = None).
    settings.SETTINGS_MODULE = settings_module
    assert project_packages() == packages
