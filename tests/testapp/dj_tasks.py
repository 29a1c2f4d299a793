"""Sample ``django.tasks`` tasks for the backend tests (``TASKS["default"]`` is PgTasksBackend).

The first block is Django's own documentation (topics/tasks), copied unchanged except that the
variants of ``email_users`` get distinct names so that they can share one module.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import timedelta
from typing import Any

from django.core.mail import send_mail

from django_pgtasks.definition.framework import TaskContext, TaskResult, task

from .models import Execution

# -- Django's documentation examples ---------------------------------------------------------

logger = logging.getLogger(__name__)


@task
def email_users(emails, subject, message):
    return send_mail(
        subject=subject, message=message, from_email=None, recipient_list=emails
    )


@task(priority=2, queue_name="emails")
def email_users_on_the_emails_queue(emails, subject, message):
    return send_mail(
        subject=subject, message=message, from_email=None, recipient_list=emails
    )


@task(takes_context=True)
def email_users_with_context(context, emails, subject, message):
    logger.debug(
        f"Attempt {context.attempt} to send user email. Task result id: {context.task_result.id}."
    )
    return send_mail(
        subject=subject, message=message, from_email=None, recipient_list=emails
    )


@task()
def double_dictionary(key):
    return {key: key * 2}


@task()
def process_data(data):
    return data


@task()
def calculate_meaning_of_life() -> int:
    return 42


# -- tasks of the test suite -----------------------------------------------------------------


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def echo(*args: Any, **kwargs: Any) -> list[Any]:
    """Returns its arguments as they arrived."""
    return [list(args), kwargs]


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


@task
async def async_thread_name() -> str:
    """The name of the thread it ran on (the async pool's loop, or a pool thread)."""
    await asyncio.sleep(0)
    return threading.current_thread().name


@task
async def async_fails(message: str = "boom") -> None:
    await asyncio.sleep(0)
    raise ValueError(message)


@task(takes_context=True)
def context_info(context: TaskContext) -> dict[str, Any]:
    result = context.task_result
    return {"id": result.id, "attempt": context.attempt, "status": str(result.status),
            "worker_ids": result.worker_ids, "backend": result.backend}


@task(takes_context=True)
def log_execution(context: TaskContext) -> None:
    """Writes one Execution row per run (at-least-once: before the completion commits)."""
    result = context.task_result
    Execution.objects.create(task_id=int(result.id), worker=result.worker_ids[-1],
                             attempt=context.attempt)


@task
def fails(message: str = "boom") -> None:
    raise ValueError(message)


@task
def returns_object() -> object:
    return object()


@task
def raises_keyboard_interrupt() -> None:
    raise KeyboardInterrupt


@task
def exits() -> None:
    raise SystemExit(3)


@task(takes_context=True, max_attempts=3, backoff="linear")
def flaky(context: TaskContext, fail_times: int) -> str:
    """Fails ``fail_times`` attempts, then succeeds (PGTASKS["BACKOFF_BASE"] is 0 in tests)."""
    result = context.task_result
    Execution.objects.create(task_id=int(result.id), worker=result.worker_ids[-1],
                             attempt=context.attempt)
    if context.attempt <= fail_times:
        raise ConnectionError(f"attempt {context.attempt} failed")
    return "ok"


@task(max_attempts=3)
def fails_with_default_backoff() -> None:
    raise ConnectionError("still down")


seen_by_backoff: list[tuple[str, str, int, int]] = []


def give_up_on_value_errors(exception: BaseException, task_result: TaskResult
                            ) -> timedelta | None:
    """Retry connection problems in an hour; stop at once on anything else."""
    seen_by_backoff.append((type(exception).__name__, str(task_result.status),
                            len(task_result.errors), task_result.attempts))
    return timedelta(hours=1) if isinstance(exception, ConnectionError) else None


@task(max_attempts=5, backoff=give_up_on_value_errors)
def fails_as_told(error: str) -> None:
    raise {"value": ValueError, "connection": ConnectionError}[error](error)


@task(takes_context=True)
def chaos_django(context: TaskContext) -> None:
    """Chaos test through Django's tasks API, with its default of one attempt."""
    Execution.objects.create(task_id=int(context.task_result.id), worker="",
                             attempt=context.attempt)


# -- workflows (tests/integration/test_workflows.py) ----------------------------------------


@task
def dj_double(n: int) -> int:
    return 2 * n


@task(takes_context=True)
def dj_sum_of_parents(context: TaskContext) -> int:
    from django_pgtasks.backend.workflows import parent_outcomes

    return sum(outcome.result for outcome in parent_outcomes(context))


# -- the tasks of Django's own test suite (tests/tasks/tasks.py) that the contract ports ------


@task
def noop(*args: Any, **kwargs: Any) -> None:
    return None


@task
async def async_noop(*args: Any, **kwargs: Any) -> None:
    return None


@task
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


# -- durable parts through Django's context ----------------------------------------------------


@task(takes_context=True)
def durable_through_djangos_context(context, key: str) -> Any:
    """A step, a durable sleep and a wait, through the context Django's API passes."""
    first = context.step("record", lambda: Execution.objects.create(
        task_id=0, attempt=context.attempt, worker=f"dj-{key}").pk)
    context.logger.info("recorded %s", first)
    context.progress(1, 2, "recorded")
    context.sleep(3600)
    return {"record": first, "payload": context.wait_for_event(key),
            "result_id": context.task_result.id}


@task
def hangs_until(started: str, gate: str) -> str:
    """Writes the file ``started``, then waits (heedless of any cancellation) until the file
    ``gate`` exists."""
    from .workload import wait_for_gate

    open(started, "w").close()
    wait_for_gate(gate)
    return "finished"
