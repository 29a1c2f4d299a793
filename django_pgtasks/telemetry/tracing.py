"""OpenTelemetry tracing, when the optional ``opentelemetry-api`` is installed and configured.

Every enqueue inside a trace gets a span (kind ``PRODUCER``), and its trace context is stored
with the task, under :data:`TRACE_CONTEXT_KEY` in ``Task.metadata``; the run of the task (in
:mod:`django_pgtasks.worker.tracing`) continues that trace. See
``docs/howto/monitoring.md#tracing-with-opentelemetry``.

Whether tracing is active is decided once per process, at the first enqueue or run (and again
when a worker starts, or ``PGTASKS`` changes): it is active when ``PGTASKS["TRACING"]`` is
true, ``opentelemetry`` can be imported and an SDK has set a tracer provider. Otherwise every
function here returns after one comparison, and an enqueue or a run pays nothing measurable
for it (docs/howto/monitoring.md, "What it costs").

Nothing here may break an enqueue or a run: an error of the tracing code (or of the SDK) is
logged and the span dropped; the task's own errors are recorded on its span and go on as
they would have.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import Any

from django.core.signals import setting_changed

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition.error_text import qualified_name

logger = logging.getLogger("django_pgtasks.tracing")

#: The key of ``Task.metadata`` that holds the trace context of the enqueue (the fields the
#: configured propagator writes: ``traceparent`` and ``tracestate`` with the default W3C one).
#: Reserved: do not use it for data of your own.
TRACE_CONTEXT_KEY = "trace_context"
#: ``messaging.system`` of every span.
MESSAGING_SYSTEM = "pgtasks"
#: The instrumentation scope's name.
TRACER_NAME = "django_pgtasks"

_UNDECIDED: Any = object()
#: The tracer, once decided: ``None`` when tracing is off.
_tracer: Any = _UNDECIDED
#: ``opentelemetry.trace``, ``.context`` and ``.propagate``, imported when tracing is on.
otel: Any = None


def tracer() -> Any | None:
    """The OpenTelemetry tracer of django-pgtasks, or ``None`` when tracing is off."""
    if _tracer is _UNDECIDED:
        decide()
    return _tracer


def active() -> bool:
    """Whether enqueues and runs are traced in this process."""
    return tracer() is not None


def decide() -> bool:
    """Decide (again) whether tracing is active: ``PGTASKS["TRACING"]`` is true,
    ``opentelemetry`` is installed and a tracer provider has been set (an SDK is configured).

    Called at the first enqueue or run, when a worker starts and when ``PGTASKS`` changes;
    configure the SDK at start-up, before the first task is enqueued."""
    global _tracer
    found = None
    try:
        if pgtasks_settings.TRACING:
            found = _configured_tracer()
    except Exception:
        logger.exception("Tracing is off: the OpenTelemetry tracer could not be set up.")
        found = None
    _tracer = found
    return found is not None


def forget() -> None:
    """Decide again at the next enqueue or run (after the SDK was configured, in tests)."""
    global _tracer
    _tracer = _UNDECIDED


def _configured_tracer() -> Any | None:
    global otel
    try:
        from opentelemetry import context, propagate, trace
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    # Without an SDK the API hands out a proxy (or a no-op provider): spans would record
    # nothing, and the enqueue would still pay for making them.
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    otel = _Modules(trace, context, propagate)
    return provider.get_tracer(TRACER_NAME, _version())


class _Modules:
    """The OpenTelemetry API modules, imported once."""

    __slots__ = ("context", "propagate", "trace")

    def __init__(self, trace: ModuleType, context: ModuleType, propagate: ModuleType) -> None:
        self.trace, self.context, self.propagate = trace, context, propagate


def _version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("django-pgtasks")
    except PackageNotFoundError:
        return None


def _forget_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == "PGTASKS":
        forget()


setting_changed.connect(_forget_on_change)


# -- enqueue ------------------------------------------------------------------------------


class Enqueueing:
    """The span of one enqueue call (one task or a batch), current while its rows are written.

    Use it as a context manager around the INSERT: an exception leaving the block is recorded
    on the span (and goes on); the span ends with the block.
    """

    __slots__ = ("_carrier", "_span", "_token")

    def __init__(self, span: Any, token: Any) -> None:
        self._span = span
        self._token = token
        self._carrier: dict[str, str] | None = None

    def __enter__(self) -> Enqueueing:
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if exc is not None:
                record_error(self._span, exc)
            self._span.end()
        except Exception:
            logger.exception("Error while ending an enqueue's span.")
        finally:
            try:
                otel.context.detach(self._token)
            except Exception:
                logger.exception("Error while leaving an enqueue's span.")

    @property
    def carrier(self) -> dict[str, str] | None:
        """The trace context to store with the tasks (``None`` if there is none)."""
        if self._carrier is None:
            try:
                carrier: dict[str, str] = {}
                otel.propagate.inject(carrier, otel.trace.set_span_in_context(self._span))
                self._carrier = carrier
            except Exception:
                logger.exception("Error while taking the trace context of an enqueue.")
                self._carrier = {}
        return self._carrier or None

    def inject(self, tasks: Iterable[Any]) -> None:
        """Store the trace context in each task's ``metadata`` (a new dict each: the old one
        may be shared)."""
        carrier = self.carrier
        if carrier is None:
            return
        for task in tasks:
            if isinstance(task.metadata, dict):
                task.metadata = {**task.metadata, TRACE_CONTEXT_KEY: carrier}

    def metadata_json(self) -> str:
        """``{TRACE_CONTEXT_KEY: …}`` as JSON text, for rows written without a model."""
        carrier = self.carrier
        return json.dumps({TRACE_CONTEXT_KEY: carrier}) if carrier is not None else "{}"

    def sent(self, tasks: Sequence[Any] = (), ids: Sequence[int] = ()) -> None:
        """The rows are written: note the id of a single task (and whether it was
        deduplicated into a live one)."""
        try:
            pks = [task.pk for task in tasks] or list(ids)
            if len(pks) == 1:
                self._span.set_attribute("messaging.message.id", str(pks[0]))
                self._span.set_attribute("pgtasks.task.id", pks[0])
            for task in tasks:
                deduplicated = getattr(task, "deduplicated", None)
                if deduplicated is not None:
                    self._span.set_attribute("pgtasks.task.deduplicated", bool(deduplicated))
        except Exception:
            logger.exception("Error while completing an enqueue's span.")


class _NotTraced:
    """Stands in for :class:`Enqueueing` when there is nothing to trace."""

    __slots__ = ()
    carrier = None

    def __enter__(self) -> _NotTraced:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        return None

    def inject(self, tasks: Iterable[Any]) -> None:
        return None

    def metadata_json(self) -> str:
        return "{}"

    def sent(self, tasks: Sequence[Any] = (), ids: Sequence[int] = ()) -> None:
        return None


NOT_TRACED = _NotTraced()


def enqueueing(names: Iterable[str], queues: Iterable[str], count: int = 1,
               ) -> Enqueueing | _NotTraced:
    """Start the span of an enqueue of ``count`` tasks of ``names`` to ``queues`` (iterables,
    read only when tracing is on).

    Only inside a trace (a span is current): an enqueue outside any trace stores no context
    and makes no span, and its task's run starts a trace of its own. Without tracing, or on
    an error, a stand-in that does nothing is returned.
    """
    found = _tracer
    if found is _UNDECIDED:
        found = tracer()
    if found is None:
        return NOT_TRACED
    try:
        trace = otel.trace
        if not trace.get_current_span().get_span_context().is_valid:
            return NOT_TRACED
        names, queues = sorted(set(names)), sorted(set(queues))
        name = names[0] if len(names) == 1 else None
        queue = queues[0] if len(queues) == 1 else None
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "enqueue",
        }
        if queue is not None:
            attributes["messaging.destination.name"] = queue
        if name is not None:
            attributes["pgtasks.task.name"] = name
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        span = found.start_span(f"enqueue {name}" if name else "enqueue",
                                kind=trace.SpanKind.PRODUCER, attributes=attributes)
        try:
            token = otel.context.attach(trace.set_span_in_context(span))
        except Exception:
            span.end()
            raise
        return Enqueueing(span, token)
    except Exception:
        logger.exception("Error while starting an enqueue's span; the task is not traced.")
        return NOT_TRACED


def record_error(span: Any, exc: BaseException | None, description: str = "") -> None:
    """Record ``exc`` (if any) on ``span`` and set the span's status to error."""
    trace = otel.trace
    if exc is not None:
        kind = type(exc)
        span.set_attribute("error.type", kind.__qualname__ if kind.__module__ == "builtins"
                           else qualified_name(kind))
        description = description or f"{kind.__name__}: {_message(exc)}"
    span.set_status(trace.Status(trace.StatusCode.ERROR, description[:300] or None))
    if exc is not None:  # last: the SDK formats the exception, which may fail
        span.record_exception(exc)


def _message(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # an exception that cannot say what it is
        return f"<{type(exc).__name__} that cannot be shown as text>"
