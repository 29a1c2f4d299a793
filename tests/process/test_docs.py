"""The documentation cannot rot: it builds strictly, the references are complete, and every
code block of the tutorial runs.

- The site (Sphinx with MyST, ``docs/conf.py``) builds with warnings as errors. Skipped, with
  the reason, where the ``docs`` extra is not installed (``pip install -e ".[docs]"``).
- Every ``PGTASKS`` key has a section and a summary row with its default in
  ``docs/reference/settings.md``, and every option of every management command is in
  ``docs/reference/commands.md``.
- The tutorial (``docs/tutorial.md``) is followed literally in a project made by the running
  Django's ``startproject``: its ``# path`` Python blocks become the project's files (a
  ``# settings.py`` block is merged into the project's settings, and a block headed
  ``# path (Django 5.2 and 6.0)`` only applies there), its console commands run, its
  ``pycon`` sessions run as doctests in ``manage.py shell`` order, and the worker's log in its
  ``text`` block matches what the worker logs. A new block the test does not know fails it.
"""

from __future__ import annotations

import importlib.util
import pickle
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
from django_pgtasks.worker.process_count import usable_cpus
from tests.conftest import ROOT

DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(?P<lang>[\w{}-]*)[^\n]*\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)


def code_blocks(path: Path) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block of a Markdown page, in order."""
    return [(m["lang"], m["body"]) for m in FENCE.finditer(path.read_text())]


# -- The site ----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_documentation_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """Every page is read and every reference resolved, warnings as errors. The ``dummy``
    builder does all of that (a broken link, anchor or label, an autodoc import error, a page
    outside every toctree fail it as they fail the HTML build) without rendering HTML pages,
    half of the build's time; the doctrees it keeps show what the pages hold."""
    missing = [name for name in ("sphinx", "myst_parser", "furo")
               if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)} missing): "
                    f'pip install -e ".[docs]"')
    doctrees = tmp_path / "doctrees"
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "dummy",
         "-d", str(doctrees), str(DOCS), str(tmp_path / "out")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, f"{build.stdout}\n{build.stderr}"
    assert (doctrees / "tutorial.doctree").exists()
    with (doctrees / "reference" / "autodoc.doctree").open("rb") as f:
        api = pickle.load(f).astext()
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
    # The test makes the project itself (the same command, into its own folder).
    "django-admin startproject mysite": None,
    "cd mysite": None,
    "python manage.py startapp accounts": ["startapp", "accounts"],
    # The package is installed in the test environment; the clone's URL and the extra must be
    # the project's.
    "git clone https://github.com/django-pgtasks/django-pgtasks.git": None,
    'python -m pip install "./django-pgtasks[binary]"': None,
    "python manage.py migrate": ["migrate"],
    # The tutorial's worker runs until Ctrl-C; --burst stops it once the queue is drained.
    "python manage.py run_pgtasks": ["run_pgtasks", "--burst"],
}

#: What the reader's project, made by ``startproject``, is told besides the tutorial: its
#: database is PostgreSQL.
PROJECT_DATABASE = '''
from django_pgtasks_dev import database_config
DATABASES = {"default": database_config("tutorial")}
'''

#: ``INSTALLED_APPS = [...]`` of a settings block, whose ``# ...`` stands for the project's apps.
INSTALLED_APPS = re.compile(r"^INSTALLED_APPS = \[\n(?P<apps>.*?)^\]\n", re.MULTILINE | re.DOTALL)


def applies_here(header: str) -> bool:
    """Whether a block headed ``# path (Django 5.2 and 6.0)`` is for the Django running."""
    import django

    versions = re.search(r"\(Django ([\d. and]+)\)", header)
    return versions is None or f"{django.VERSION[0]}.{django.VERSION[1]}" in versions[1].split(
        " and ")


def merge_settings(settings: Path, block: str) -> None:
    """Do what the tutorial's settings block says to a project's settings: its apps join the
    project's (``# ...``), its other lines are added at the end."""
    apps = INSTALLED_APPS.search(block)
    if apps:
        names = re.findall(r'"([\w.]+)"', apps["apps"])
        block = (block[:apps.start()] + f"INSTALLED_APPS += [app for app in {names!r} "
                 f"if app not in INSTALLED_APPS]\n" + block[apps.end():])
    settings.write_text(settings.read_text() + "\n" + block)


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
    line = re.sub(r"^.*? INFO \[[\w-]+ \d+\] ", "", line)
    line = re.sub(r"pid=\d+", "pid=N", line)
    return re.sub(r"duration=[\d.]+s", "duration=Ns", line)


@pytest.mark.slow
def test_every_code_block_of_the_tutorial_runs(
    tmp_path: Path, tutorial_database: dict[str, str]
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    # The reader's project, as this Django's startproject makes it (Django 6.1's configures
    # email with MAILERS, say), on PostgreSQL; the tutorial's startapp makes the accounts app.
    subprocess.run([sys.executable, "-m", "django", "startproject", "mysite", str(project)],
                   check=True, capture_output=True, timeout=60)
    settings = project / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + PROJECT_DATABASE)
    env = {**tutorial_database, "DJANGO_SETTINGS_MODULE": "mysite.settings",
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
            header, _, code = body.partition("\n")
            assert header.startswith("# "), f"a Python block must start with '# path':\n{body}"
            if not applies_here(header):
                continue
            path = header[2:].split(" (")[0].strip()
            if path == "settings.py":
                if code.startswith("DATABASES = "):
                    # The reader's server; the test's stays (PROJECT_DATABASE): the block
                    # must at least name PostgreSQL.
                    assert '"django.db.backends.postgresql"' in code, code
                    continue
                merge_settings(settings, code)
                continue
            target = project / path
            target.parent.mkdir(parents=True, exist_ok=True)
            (target.parent / "__init__.py").touch()
            target.write_text(code)
        elif lang == "console":
            for line in body.splitlines():
                command = line.removeprefix("$ ").strip()
                assert command in CONSOLE, f"unknown tutorial command, teach the test: {line}"
                if CONSOLE[command] is None:
                    pyproject = (ROOT / "pyproject.toml").read_text()
                    if command.startswith(("django-admin startproject ", "cd ")):
                        continue  # done above, into the test's own folder
                    if command.startswith("git clone "):
                        assert command.split()[-1].removesuffix(".git") in pyproject, command
                        continue
                    extra = re.search(r"django-pgtasks\[(\w+)\]", command)
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
                process = re.match(r"Started worker process (\d+) ", expected)
                if process and int(process.group(1)) >= usable_cpus():
                    continue  # the tutorial's machine has two CPUs, this one fewer
                if expected.startswith("Worker "):
                    assert any(re.fullmatch(
                        r"Worker \S+ started: queues=default,emails concurrency=4 pool=thread "
                        r"burst=True",
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
