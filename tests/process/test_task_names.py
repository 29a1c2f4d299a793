"""Stored task names import nothing arbitrary; a handler that fails to import is an interruption.

A row's ``name`` is data: whoever can write a row must not make a worker import a module
outside the installed apps. And a handler's module that cannot be imported *now* (a missing
dependency, a deploy in progress) raises ``HandlerImportError``, which the worker treats as an
interruption, instead of failing its task for good as an unknown name.
"""

from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_pgtasks.definition import registry
from django_pgtasks.definition.registry import get_handler
from django_pgtasks.exceptions import (
    FatalError,
    HandlerImportError,
    TaskInterrupted,
    UnknownTaskError,
)
from django_pgtasks.models import Task
from tests.testapp.broken_tasks import FLAG

backend = pytest.importorskip("django_pgtasks.backend")
backend_handler = pytest.importorskip("django_pgtasks.backend.handler")
backend_importing = pytest.importorskip("django_pgtasks.backend.importing")
backend_resolver = pytest.importorskip("django_pgtasks.backend.resolver")

ROOT = Path(__file__).resolve().parents[2]
BROKEN = "tests.testapp.broken_tasks"
#: A module of an installed app that does not exist in this code.
NOT_DEPLOYED = "tests.testapp.not_deployed_yet"
DJANGO_TASKS = {"django_tasks": {"backend": "default"}}


# -- names outside installed apps: nothing is imported ---------------------------------------

# ``this`` prints the Zen of Python when imported: an import would show on stdout.
PROBE = textwrap.dedent("""
    import sys

    import django

    django.setup()
    assert "this" not in sys.modules, "imported before the probe"
    from django_pgtasks import backend
    from django_pgtasks.backend import handler as backend_handler
    from django_pgtasks.definition import registry
    from django_pgtasks.exceptions import FatalError, UnknownTaskError
    from django_pgtasks.models import Task

    try:
        outcome = repr({call})
    except (FatalError, UnknownTaskError) as exc:
        outcome = f"{{type(exc).__name__}}: {{exc}}"
    print(outcome, file=sys.stderr)
    assert "this" not in sys.modules, "imported by the call"
""")


@pytest.mark.slow
@pytest.mark.parametrize(("call", "outcome"), [
    ("registry.get_handler('this.s')", "UnknownTaskError: No task handler is registered"),
    ("backend.resolve('this.s')", "None"),
    ("backend.import_task('this.s')", "None"),
    ("backend_handler._Run.for_row(Task(name='this.s', metadata={'django_tasks': "
     "{'backend': 'default'}}))", "FatalError: 'this.s' names no django.tasks Task"),
])
def test_a_name_outside_installed_apps_imports_nothing(call: str, outcome: str) -> None:
    # A fresh process: in this one, anything may have imported anything already.
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "PATH": "/usr/bin:/bin"}
    process = subprocess.run(
        [sys.executable, "-c", PROBE.format(call=call)], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120,
    )
    assert process.returncode == 0, process.stderr
    assert process.stdout == ""
    assert process.stderr.splitlines()[-1].startswith(outcome), process.stderr


def test_the_unknown_name_says_why_it_was_not_imported() -> None:
    with pytest.raises(UnknownTaskError, match=r"Only modules of installed apps, of the "
                                               r"project's package and of "
                                               r"PGTASKS\['TASK_MODULES'\] are imported by "
                                               r"name, and 'this' is none of them\.$"):
        get_handler("this.s")


# -- a module of an installed app that fails to import: an interruption ----------------------


def forget_broken_module() -> None:
    """As if no code in this process had ever imported ``tests.testapp.broken_tasks``."""
    sys.modules.pop(BROKEN, None)
    vars(sys.modules["tests.testapp"]).pop("broken_tasks", None)
    for name in [name for name in registry._registry if name.startswith(BROKEN + ".")]:
        del registry._registry[name]
    for table in (backend_resolver._handlers, backend_importing._tasks):
        for name in [name for name in table if name.startswith(BROKEN + ".")]:
            del table[name]


@pytest.fixture
def broken(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """``tests.testapp.broken_tasks`` fails to import (``raise``) until the flag is changed."""
    forget_broken_module()
    monkeypatch.setenv(FLAG, "raise")
    yield monkeypatch
    forget_broken_module()


def import_errors(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "django_pgtasks" and r.exc_info]


def test_a_module_that_raises_on_import_is_an_interruption(
    broken: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(HandlerImportError) as caught:
        get_handler(f"{BROKEN}.some_task")
    assert isinstance(caught.value, TaskInterrupted)
    assert str(caught.value) == (
        f"The module {BROKEN!r} of the task '{BROKEN}.some_task' raised while being imported "
        f"(RuntimeError: {BROKEN} fails to import while {FLAG} is set.)."
    )
    assert isinstance(caught.value.__cause__, RuntimeError)
    [record] = import_errors(caplog)  # logged once, with its traceback
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        f"Task name={BROKEN}.some_task: importing its module {BROKEN} failed.")
    assert record.exc_info[1] is caught.value.__cause__
    assert "Traceback" in caplog.text


def test_a_failed_import_is_tried_again_and_its_half_registered_handlers_forgotten(
    broken: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"{BROKEN}.some_task"
    for _ in range(2):
        with pytest.raises(HandlerImportError):
            get_handler(name)
        # The module registered some_task before it raised: that handler must not be found.
        assert name not in registry.registered_names()
    assert len(import_errors(caplog)) == 2
    broken.delenv(FLAG)  # the deploy finished
    handler = get_handler(name)
    assert handler.name == name
    assert handler() == "imported"


def test_a_missing_dependency_is_an_interruption(broken: pytest.MonkeyPatch) -> None:
    broken.setenv(FLAG, "dependency")
    with pytest.raises(HandlerImportError, match=r"raised while being imported "
                       r"\(ModuleNotFoundError: No module named "
                       r"'pgtasks_test_no_such_dependency'\)\.$"):
        get_handler(f"{BROKEN}.some_task")


def test_a_missing_module_of_an_installed_app_is_an_interruption(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A task enqueued by newer code reaches a worker that still runs the old code: it is run
    # again later (within the interruption budget), not failed as unknown.
    with pytest.raises(HandlerImportError, match=(
        rf"The module '{NOT_DEPLOYED}' of the task '{NOT_DEPLOYED}\.send' does not exist in "
        rf"this code \(ModuleNotFoundError: No module named '{NOT_DEPLOYED}'\): the name is "
        rf"misspelt, or the task was enqueued by newer code than this process runs\.$"
    )):
        get_handler(f"{NOT_DEPLOYED}.send")
    assert len(import_errors(caplog)) == 1
    # A module that imports but does not register the name: unknown, nothing to wait for.
    with pytest.raises(UnknownTaskError, match="No task handler is registered"):
        get_handler("tests.testapp.tasks.not_there")


@pytest.mark.django_db
def test_enqueue_by_name_of_a_module_that_fails_to_import_raises_and_writes_nothing(
    broken: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(HandlerImportError, match="raised while being imported"):
        Task.objects.enqueue(f"{BROKEN}.some_task")
    with pytest.raises(HandlerImportError, match="does not exist in this code"):
        Task.objects.enqueue(f"{NOT_DEPLOYED}.send")
    assert not Task.objects.exists()


# -- the django.tasks backend ----------------------------------------------------------------


def django_row(name: str) -> Task:
    """An unsaved row as ``PgTasksBackend`` writes it."""
    return Task(pk=1, name=name, metadata=DJANGO_TASKS)


def test_the_backend_resolver_raises_for_a_module_that_fails_to_import(
    broken: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"{BROKEN}.some_django_task"
    with pytest.raises(HandlerImportError, match="raised while being imported"):
        backend.resolve(name)
    with pytest.raises(HandlerImportError, match="raised while being imported"):
        backend.import_task(name)
    with pytest.raises(HandlerImportError, match="raised while being imported"):
        backend_handler._Run.for_row(django_row(name))
    assert len(import_errors(caplog)) == 3  # once per import tried, never twice for one
    broken.delenv(FLAG)
    assert isinstance(backend.resolve(name), backend.DjangoTaskHandler)


def test_the_backend_and_a_missing_module_of_an_installed_app() -> None:
    name = f"{NOT_DEPLOYED}.add"
    # The resolver only says that no Django task is there; the registry raises.
    assert backend.resolve(name) is None
    with pytest.raises(HandlerImportError, match="does not exist in this code"):
        get_handler(name)
    # A row the worker has resolved already: its module gone meanwhile is an interruption.
    with pytest.raises(HandlerImportError, match="does not exist in this code"):
        backend_handler._Run.for_row(django_row(name))
    with pytest.raises(FatalError, match=r"names no django\.tasks Task of an installed app, "
                                         r"of the project's package or of "
                                         r"PGTASKS\['TASK_MODULES'\]"):
        backend_handler._Run.for_row(django_row("tests.testapp.dj_tasks.nothing"))


#: A package outside installed apps and the project's, written by :func:`outside_modules`.
OUTSIDE = "pgtasks_outside_h30"
#: Another, listed in PGTASKS["TASK_MODULES"] by the settings :func:`outside_modules` writes.
LISTED = "pgtasks_listed_h30"
TASK_SOURCE = textwrap.dedent("""
    from django_pgtasks.definition.framework import task


    @task
    def triple(x: int) -> int:
        return 3 * x
""")
SETTINGS_SOURCE = textwrap.dedent(f"""
    from tests.settings import *  # noqa: F403

    PGTASKS = {{**PGTASKS, "TASK_MODULES": ["{LISTED}"]}}  # noqa: F405
""")


@pytest.fixture
def outside_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Two packages on ``sys.path``, ``OUTSIDE`` and ``LISTED``, each with a ``tasks`` module
    of one Django task ``triple``, and a top-level settings module
    ``pgtasks_listed_settings`` (the test settings with ``LISTED`` in TASK_MODULES)."""
    for package in (OUTSIDE, LISTED):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "tasks.py").write_text(TASK_SOURCE)
    (tmp_path / "pgtasks_listed_settings.py").write_text(SETTINGS_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for package in (OUTSIDE, LISTED):
        for name in (package, f"{package}.tasks"):
            sys.modules.pop(name, None)
        for table in (backend_resolver._handlers, backend_importing._tasks):
            table.pop(f"{package}.tasks.triple", None)


def test_the_project_package_and_task_modules_may_be_imported_by_name(
    outside_modules: Path, settings: Any,
) -> None:
    # ``tests`` is the package of the settings module and of ROOT_URLCONF, not an app.
    assert registry.project_packages() == ["tests"]
    assert registry.installed_module_of("tests.djtasks.multiply") == "tests.djtasks"
    assert registry.installed_module_of(f"{LISTED}.tasks.triple") is None
    settings.PGTASKS = {**settings.PGTASKS, "TASK_MODULES": [LISTED]}
    assert registry.installed_module_of(f"{LISTED}.tasks.triple") == f"{LISTED}.tasks"
    assert registry.installed_module_of(f"{LISTED}x.tasks.triple") is None  # a prefix, not text
    assert registry.installed_module_of(f"{OUTSIDE}.tasks.triple") is None
    assert registry.installed_module_of("this.s") is None
    assert backend.import_task(f"{LISTED}.tasks.triple") is not None


def test_a_django_task_outside_importable_modules_runs_only_where_it_was_enqueued(
    outside_modules: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"{OUTSIDE}.tasks.triple"
    # A worker process would not import it (no app, not the project's, not listed):
    assert backend.resolve(name) is None
    assert OUTSIDE not in sys.modules
    module = importlib.import_module(f"{OUTSIDE}.tasks")
    handler = backend.handler_for(module.triple)
    backend.handler_for(module.triple)
    [warning] = [r for r in caplog.records if r.name == "django_pgtasks.backend"]
    assert warning.getMessage().startswith(f"Task name={name} is in no installed app, nor in "
                                           f"the project's package or PGTASKS['TASK_MODULES']")
    # ... but this process enqueued it, so it finds it without importing anything.
    assert backend.resolve(name) is handler
    assert backend.import_task(name) is module.triple


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_runs_tasks_of_the_project_package_and_of_task_modules(
    outside_modules: Path, start_command,
) -> None:
    from tests import djtasks

    project = djtasks.multiply.enqueue(6, 7)
    listed = importlib.import_module(f"{LISTED}.tasks").triple.enqueue(5)
    outside = importlib.import_module(f"{OUTSIDE}.tasks").triple.enqueue(5)
    # --skip-checks: nothing imports these modules in the worker but, before, the row's name.
    process = start_command(
        "run_pgtasks", "--burst", "--skip-checks", "--log-level", "WARNING",
        DJANGO_SETTINGS_MODULE="pgtasks_listed_settings",
        PYTHONPATH=f"{outside_modules}{os.pathsep}{ROOT}",
    )
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0, output
    project.refresh()
    listed.refresh()
    assert (project.status, project.return_value) == ("SUCCESSFUL", 42), output
    assert (listed.status, listed.return_value) == ("SUCCESSFUL", 15), output
    row = Task.objects.get(pk=int(outside.id))
    assert row.status == "FAILED", output
    assert f"No task handler is registered under the name '{OUTSIDE}.tasks.triple'" \
        in row.error_text
    assert f"'{OUTSIDE}.tasks' is none of them." in row.error_text
