"""Handlers for the lifecycle tests (tests/chaos/test_lifecycle.py): outputs PostgreSQL cannot
store, exceptions whose text cannot be encoded, runs that lose their database connection."""

from __future__ import annotations

from django.db import connection

from django_pgtasks import TaskContext, pgtask
from tests.testapp.models import Execution

#: Return values that PostgreSQL cannot store as ``jsonb``, by name.
POISON = {
    "nul_key": lambda: {"a\x00b": 1},
    "nul_value": lambda: ["ok", "a\x00b"],
    "surrogate": lambda: "x\ud800y",
    "surrogate_key": lambda: {"x\udcffy": 1},
    "huge_int": lambda: 10**5000,
}


@pgtask(max_attempts=1)
def returns_poison(kind: str) -> object:
    return POISON[kind]()


@pgtask(max_attempts=1)
def raises_undecodable_path() -> None:
    # A file name decoded with surrogateescape carries lone surrogates into the message.
    name = b"/tmp/report-\xff.csv".decode("utf-8", "surrogateescape")
    raise FileNotFoundError(f"No such file: {name}")


@pgtask(context=True, max_attempts=1)
def loses_its_connection(ctx: TaskContext) -> str:
    """The first run's connection is terminated by the server; the next run succeeds."""
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)
    if Execution.objects.filter(task_id=ctx.task_id).count() == 1:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    return "done"


@pgtask(context=True, max_attempts=1)
def logged(ctx: TaskContext) -> int:
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)
    return ctx.task_id


@pgtask(context=True, max_attempts=1)
def logged_sleep(ctx: TaskContext, seconds: float) -> None:
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)
    ctx.wait(seconds)


@pgtask(context=True, max_attempts=1)
def chaos_one_attempt(ctx: TaskContext) -> None:
    """Chaos test with one attempt: a killed worker must cost no task its only attempt."""
    Execution.objects.create(task_id=ctx.task_id, worker=ctx.worker_id, attempt=ctx.attempt)


@pgtask(context=True, max_attempts=1)
def stages_a_followup(ctx: TaskContext) -> str:
    """A non-atomic pipeline stage: its success and its next stage commit together."""
    from tests.testapp.tasks import noop

    ctx.then(noop)
    return "staged"
