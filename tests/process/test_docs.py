"""The documentation cannot rot: it builds strictly, the references are complete, and every
code block of the tutorial runs.

- The site (Sphinx with MyST, ``docs/conf.py``) builds with warnings as errors. Skipped, with
  the reason, where the ``docs`` extra is not installed (``pip install -e ".[docs]"``).
- Every ``PGTASKS`` key has a section and a summary row with its default in
  ``docs/reference/settings.md``, and every option of every management command is in
  ``docs/reference/commands.md``.
- The tutorial (``docs/tutorial.md``) is followed literally in a project of its own: its
  ``# path`` Python blocks become the project's files, its console commands run, its
  ``pycon`` sessions run as doctests in ``manage.py shell`` order, and the worker's log in its
  ``text`` block matches what the worker logs. A new block the test does not know fails it.
"""

from __future__ import annotations

import importlib.util
import re
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import get_commands, load_command_class
from django.db import connection
from psycopg import sql

from django_pgtasks.conf import DEFAULTS
from tests.conftest import ROOT

DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(?P<lang>[\w{}-]*)[^\n]*\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


def code_blocks(path: Path) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block of a Markdown page, in order."""
    return [(m["lang"], m["body"]) for m in FENCE.finditer(path.read_text())]


# -- The site ----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_documentation_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    missing = [name for name in ("sphinx", "myst_parser", "furo")
               if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)} missing): "
                    f'pip install -e ".[docs]"')
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html",
         str(DOCS), str(tmp_path / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, f"{build.stdout}\n{build.stderr}"
    assert (tmp_path / "html" / "tutorial.html").exists()
    api = (tmp_path / "html" / "reference" / "autodoc.html").read_text()
    assert "enqueue_many" in api  # the API reference comes from the docstrings


# -- References ----------------------------------------------------------------------------


def documented_default(value: Any) -> str:
    if isinstance(value, timedelta):
        return f"timedelta(days={value.days})" if not value.seconds else repr(value)
    return repr(value)


@pytest.mark.parametrize("key", list(DEFAULTS))
def test_every_setting_is_documented_with_its_default(key: str) -> None:
    text = (DOCS / "reference" / "settings.md").read_text()
    assert f"\n### `{key}`\n" in text, f"no section for {key} in docs/reference/settings.md"
    rows = [line for line in text.splitlines() if line.startswith(f"| [`{key}`]")]
    assert len(rows) == 1, f"no summary row for {key} in docs/reference/settings.md"
    assert f"`{documented_default(DEFAULTS[key])}`" in rows[0], (
        f"the summary row of {key} does not show its default "
        f"{documented_default(DEFAULTS[key])}"
    )


#: Options every Django command has; docs/reference/commands.md mentions them once for all.
COMMON_OPTIONS = {"--help", "--version", "--verbosity", "--settings", "--pythonpath",
                  "--traceback", "--no-color", "--force-color", "--skip-checks"}


def pgtasks_commands() -> list[str]:
    return sorted(name for name, app in get_commands().items() if app == "django_pgtasks")


@pytest.mark.parametrize("name", pgtasks_commands())
def test_every_command_option_is_documented(name: str) -> None:
    text = (DOCS / "reference" / "commands.md").read_text()
    assert f"## `{name}`" in text, f"no section for {name} in docs/reference/commands.md"
    parser = load_command_class("django_pgtasks", name).create_parser("manage.py", name)
    options = {
        option for action in parser._actions for option in action.option_strings
        if option.startswith("--")
    } - COMMON_OPTIONS
    section = text.partition(f"## `{name}`")[2].partition("\n## ")[0]
    undocumented = sorted(o for o in options if f"`{o}" not in section)
    assert not undocumented, f"{name}: options missing from its section: {undocumented}"


# -- The tutorial ------------------------------------------------------------------------

TUTORIAL = DOCS / "tutorial.md"

#: The console commands of the tutorial, and what the test runs for each. ``None``: not run,
#: with the reason checked otherwise.
CONSOLE = {
    # The package is installed in the test environment; the extra must exist.
    'python -m pip install "django-pgtasks[binary]"': None,
    "python manage.py migrate": ["migrate"],
    # The tutorial's worker runs until Ctrl-C; --burst stops it once the queue is drained.
    "python manage.py run_pgtasks": ["run_pgtasks", "--burst"],
}

#: Settings the tutorial assumes its reader's project already has.
PROJECT_SETTINGS = '''\
from django_pgtasks.dev import database_config

SECRET_KEY = "tutorial-test"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
DATABASES = {"default": database_config("tutorial")}
ROOT_URLCONF = "urls"
'''

SHELL = '''\
import doctest, sys
import django
django.setup()
source = open(sys.argv[1]).read()
test = doctest.DocTestParser().get_doctest(source, {}, sys.argv[1], sys.argv[1], 0)
runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
runner.run(test)
sys.exit(1 if runner.failures else 0)
'''


@pytest.fixture
def tutorial_database(subprocess_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """A fresh database for the tutorial's project (ids start at 1, as the tutorial shows)."""
    name = f"pgtasks_tutorial_{secrets.token_hex(4)}"
    s = connection.settings_dict
    params = {k: str(v) for k, v in {"user": s["USER"], "password": s["PASSWORD"],
                                     "host": s["HOST"], "port": s["PORT"]}.items() if v}
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield {**subprocess_env, "PGDATABASE": name}
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


def normalize_log(line: str) -> str:
    """A worker log line without what changes from run to run."""
    line = re.sub(r"^.*? INFO \[\w+ \d+\] ", "", line)
    return re.sub(r"duration=[\d.]+s", "duration=Ns", line)


@pytest.mark.slow
def test_every_code_block_of_the_tutorial_runs(
    tmp_path: Path, tutorial_database: dict[str, str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    # The reader's existing project: an accounts app (no models needed) and a URLconf.
    (project / "accounts").mkdir()
    (project / "accounts" / "__init__.py").touch()
    (project / "urls.py").write_text("urlpatterns = []\n")
    env = {**tutorial_database, "DJANGO_SETTINGS_MODULE": "settings",
           "PYTHONPATH": f"{project}:{ROOT}"}

    def manage(*args: str) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [sys.executable, "-m", "django", *args], cwd=project, env=env,
            capture_output=True, text=True, timeout=120,
        )
        assert result.returncode == 0, (
            f"django-admin {' '.join(args)}: exit {result.returncode}\n"
            f"{result.stdout}\n{result.stderr}"
        )
        return result

    worker_log = ""
    sessions = 0
    for lang, body in code_blocks(TUTORIAL):
        if lang == "python":
            path, _, code = body.partition("\n")
            assert path.startswith("# "), f"a Python block must start with '# path':\n{body}"
            target = project / path[2:].strip()
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.parent / "__init__.py").touch()
            if target.name == "settings.py":
                code = PROJECT_SETTINGS + code
            target.write_text(code)
        elif lang == "console":
            for line in body.splitlines():
                command = line.removeprefix("$ ").strip()
                assert command in CONSOLE, f"unknown tutorial command, teach the test: {line}"
                if CONSOLE[command] is None:
                    extra = re.search(r"django-pgtasks\[(\w+)\]", command)
                    pyproject = (ROOT / "pyproject.toml").read_text()
                    assert extra, command
                    assert f"\n{extra[1]} = [" in pyproject, command
                    continue
                result = manage(*CONSOLE[command])
                if CONSOLE[command][0] == "run_pgtasks":
                    worker_log = result.stderr
        elif lang == "pycon":
            sessions += 1
            session = tmp_path / f"session{sessions}.txt"
            session.write_text(body)
            script = tmp_path / "shell.py"
            script.write_text(SHELL)
            result = subprocess.run(
                [sys.executable, str(script), str(session)], cwd=project, env=env,
                capture_output=True, text=True, timeout=120,
            )
            assert result.returncode == 0, f"session {sessions} differs:\n{result.stdout}"
        elif lang == "text":
            # The worker's log, as the tutorial shows it: every line is in the real log.
            assert worker_log, "the tutorial shows a worker log before running the worker"
            logged = {normalize_log(line) for line in worker_log.splitlines()}
            for line in body.splitlines():
                expected = normalize_log(line)
                if expected.startswith("Worker "):
                    assert any(re.fullmatch(
                        r"Worker \S+ started: queues=default,emails concurrency=4 burst=True",
                        got) for got in logged), worker_log
                else:
                    assert expected in logged, f"not in the worker's log: {line}\n{worker_log}"
        else:
            pytest.fail(f"a {lang or 'plain'} block in the tutorial, which the test does not "
                        f"know how to run:\n{textwrap.shorten(body, 200)}")

    assert sessions == 2
    assert (project / "accounts" / "views.py").exists()

    # The view of section 4, called as a request would.
    view = manage("shell", "-c", textwrap.dedent("""
        from django.test import RequestFactory
        from accounts.views import sign_up
        from django_pgtasks.models import Task
        request = RequestFactory().post(
            "/", {"username": "grace", "email": "grace@example.com", "password": "x"})
        response = sign_up(request)
        task = Task.objects.latest("id")
        print(response.status_code, task.name, task.status)
    """))
    # (The last line: Django 5.2+ first says how many objects its shell imported.)
    assert view.stdout.splitlines()[-1].split() == [
        "201", "accounts.tasks.send_welcome_email", "READY"]
