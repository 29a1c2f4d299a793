"""The span of a task's run (OpenTelemetry, kind ``CONSUMER``), child of its enqueue's span.

:func:`start_run` opens it when a pool thread takes the task, as the child of the trace
context stored at enqueue (in ``Task.metadata``, under
:data:`~django_pgtasks.telemetry.tracing.TRACE_CONTEXT_KEY`), and makes it current while the
handler runs, so the handler's own spans (queries, HTTP calls) and the tasks it enqueues
belong to the same trace. :func:`end_run` closes it once the run's outcome is recorded,
whichever way the run ended: every path of :mod:`django_pgtasks.worker.executor` that hands
in an outcome ends it, exactly once (the span is taken off the task).

With tracing off (:func:`django_pgtasks.telemetry.tracing.tracer` is ``None``) both return after
one comparison. An error of the tracing code is logged, never raised: it must not keep a
claimed task from its recorded outcome.
"""

from __future__ import annotations

import logging
from typing import Any

from django_pgtasks.exceptions import Snooze, TaskCancelled
from django_pgtasks.lifecycle.transitions import (
    Cancelled,
    Failed,
    Interrupted,
    Outcome,
    Snoozed,
    Suspended,
    Unstarted,
)
from django_pgtasks.models import Status
from django_pgtasks.telemetry import tracing

logger = logging.getLogger("django_pgtasks.tracing")

#: Where a running task keeps its span (an attribute of the task instance).
SPAN_ATTRIBUTE = "_pgtasks_span"

#: ``pgtasks.task.outcome`` by the state the outcome left the task in.
_OUTCOMES = {
    Status.SUCCESSFUL: "successful",
    Status.AWAITING_RETRY: "retry",
    Status.FAILED: "failed",
    Status.CANCELLED: "cancelled",
}
#: Outcomes that make the run span an error.
_ERRORS = frozenset({"retry", "failed", "interrupted", "lost", "unrecorded", "unstarted"})


def start_run(task: Any, worker_id: str) -> Any | None:
    """Open the span of ``task``'s run and make it current on this thread; return the token
    to give to :func:`leave` (``None``: not traced)."""
    found = tracing.tracer()
    if found is None:
        return None
    try:
        otel = tracing.otel
        trace = otel.trace
        metadata = task.metadata
        carrier = metadata.get(tracing.TRACE_CONTEXT_KEY) if isinstance(metadata, dict) else None
        # The enqueue's context, over an empty one: a run without a stored context starts a
        # trace of its own, whatever is current on the thread that runs it (drain() in a test).
        parent = otel.propagate.extract(carrier if isinstance(carrier, dict) else {},
                                        context=otel.context.Context())
        span = found.start_span(
            f"run {task.name}", context=parent, kind=trace.SpanKind.CONSUMER,
            attributes={
                "messaging.system": tracing.MESSAGING_SYSTEM,
                "messaging.operation.type": "process",
                "messaging.operation.name": "run",
                "messaging.destination.name": task.queue,
                "messaging.message.id": str(task.pk),
                "pgtasks.task.name": task.name,
                "pgtasks.task.id": task.pk,
                "pgtasks.task.attempt": task.attempt,
                "pgtasks.task.max_attempts": task.max_attempts,
                "pgtasks.worker.id": worker_id,
            },
        )
        setattr(task, SPAN_ATTRIBUTE, span)
        return otel.context.attach(trace.set_span_in_context(span, parent))
    except Exception:
        logger.exception("Task id=%s: error while starting its span; the run is not traced.",
                         getattr(task, "pk", None))
        return None


def leave(token: Any) -> None:
    """Make the span current before :func:`start_run` current again on this thread (the
    run's span itself stays open until its outcome is recorded)."""
    try:
        tracing.otel.context.detach(token)
    except Exception:
        logger.exception("Error while leaving a run's span.")


def end_run(task: Any, status: str | None, outcome: Outcome | None,
            exc: BaseException | None) -> None:
    """End the span of ``task``'s run, if it has one still open: its outcome (``status``: the
    task's new state; ``""``: no longer held; ``None``: not recorded) and its error."""
    span = task.__dict__.pop(SPAN_ATTRIBUTE, None)
    if span is None:
        return
    try:
        name = outcome_name(status, outcome)
        span.set_attribute("pgtasks.task.outcome", name)
        if status:
            span.set_attribute("pgtasks.task.status", str(status))
        if name in _ERRORS or (exc is not None and not isinstance(exc, Snooze | TaskCancelled)):
            tracing.record_error(span, exc, _description(name, outcome))
        elif exc is not None:  # a cancellation or a snooze the handler raised: not an error
            span.record_exception(exc)
    except Exception:
        logger.exception("Task id=%s: error while completing its span.", task.pk)
    finally:
        try:
            span.end()
        except Exception:
            logger.exception("Task id=%s: error while ending its span.", task.pk)


def outcome_name(status: str | None, outcome: Outcome | None) -> str:
    """How the run ended, for ``pgtasks.task.outcome``: ``successful``, ``retry``, ``failed``,
    ``cancelled``, ``snoozed``, ``suspended`` (a durable sleep or wait), ``interrupted``
    (given back to the queue), ``unstarted`` (given back before its handler started: its
    thread could not connect), ``rerun`` (its key was enqueued again while it ran),
    ``lost`` (the worker no longer held the task: nothing recorded) or ``unrecorded`` (the
    database could not be reached; the task is given back)."""
    if status is None:
        return "unrecorded"
    if status == "":
        return "lost"
    if isinstance(outcome, Unstarted):
        return "unstarted"
    if status in _OUTCOMES:
        return _OUTCOMES[status]
    if isinstance(outcome, Interrupted):
        return "interrupted"
    if isinstance(outcome, Snoozed):
        return "snoozed"
    if isinstance(outcome, Suspended):
        return "suspended"
    return "rerun"


def _description(name: str, outcome: Outcome | None) -> str:
    if name == "lost":
        return "The worker no longer held the task; the run's outcome was not recorded."
    if name == "unrecorded":
        return "The run's outcome could not be recorded; the task is given back."
    if isinstance(outcome, Failed | Interrupted | Cancelled):
        return outcome.error.partition("\n")[0]
    if isinstance(outcome, Unstarted):
        return outcome.reason.partition("\n")[0]
    return ""
