"""OpenTelemetry tracing: spans of enqueues and runs, the trace context stored with the task,
and tracing that is off, absent or broken — on real PostgreSQL, with the SDK's in-memory
exporter and real workers (in-process, and drain())."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed")

from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode

from django_pgtasks.exceptions import InvalidTaskError
from django_pgtasks.models import Status, Task
from django_pgtasks.telemetry import tracing
from django_pgtasks.telemetry.tracing import TRACE_CONTEXT_KEY
from django_pgtasks.testing import drain
from django_pgtasks.worker.loop import Worker
from tests.helpers import wait_until
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


class Spans:
    """The spans a test's tracer provider exported, and a tracer for the test's own spans."""

    def __init__(self, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
        self.provider = provider
        self.exporter = exporter
        self.tracer = provider.get_tracer("tests")

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.all() if span.name.startswith(prefix)]

    def wait_for(self, prefix: str, count: int) -> list[ReadableSpan]:
        """Poll until ``count`` spans whose name starts with ``prefix`` have ended."""
        wait_until(lambda: len(self.named(prefix)) >= count, timeout=30,
                   what=f"{count} span(s) {prefix!r}")
        found = self.named(prefix)
        assert len(found) == count, [span.name for span in found]
        return found


def configure(monkeypatch: pytest.MonkeyPatch, provider: Any) -> None:
    """Make ``provider`` the one OpenTelemetry's API returns, as an SDK set up at start-up
    would (the API lets a process set its global provider once only, so the test patches the
    getter), and let django-pgtasks decide again."""
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    tracing.forget()


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spans]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    configure(monkeypatch, provider)
    yield Spans(provider, exporter)
    tracing.forget()
    provider.shutdown()


def run_worker() -> Worker:
    worker = Worker(burst=True, concurrency=2)
    assert worker.run(install_signals=False) == 0
    return worker


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


# -- the trace goes from the enqueue to the run ----------------------------------------------


def test_the_run_continues_the_trace_of_the_enqueuing_request(spans: Spans) -> None:
    with spans.tracer.start_as_current_span("request") as request:
        task = Task.objects.enqueue(tasks.add, 2, 3, queue="emails")
    stored = Task.objects.get(pk=task.pk).metadata[TRACE_CONTEXT_KEY]
    assert stored["traceparent"].startswith("00-")

    worker = run_worker()

    [enqueue] = spans.wait_for("enqueue", 1)
    [run] = spans.wait_for("run", 1)
    trace_id = request.get_span_context().trace_id
    assert enqueue.name == "enqueue tests.testapp.tasks.add"
    assert enqueue.kind == SpanKind.PRODUCER
    assert enqueue.context.trace_id == trace_id
    assert parent_id(enqueue) == request.get_span_context().span_id
    assert dict(enqueue.attributes) == {
        "messaging.system": "pgtasks",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": "emails",
        "messaging.message.id": str(task.pk),
        "pgtasks.task.name": "tests.testapp.tasks.add",
        "pgtasks.task.id": task.pk,
        "pgtasks.task.deduplicated": False,
    }
    # The stored context is the enqueue span's: the run is its child, in the request's trace.
    version, stored_trace, stored_span, flags = stored["traceparent"].split("-")
    assert (version, stored_trace, stored_span) == (
        "00", f"{trace_id:032x}", f"{enqueue.context.span_id:016x}")
    assert int(flags, 16) & 1  # sampled
    assert run.name == "run tests.testapp.tasks.add"
    assert run.kind == SpanKind.CONSUMER
    assert run.context.trace_id == trace_id
    assert parent_id(run) == enqueue.context.span_id
    assert dict(run.attributes) == {
        "messaging.system": "pgtasks",
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "messaging.destination.name": "emails",
        "messaging.message.id": str(task.pk),
        "pgtasks.task.name": "tests.testapp.tasks.add",
        "pgtasks.task.id": task.pk,
        "pgtasks.task.attempt": 1,
        "pgtasks.task.max_attempts": 3,
        "pgtasks.task.outcome": "successful",
        "pgtasks.task.status": "SUCCESSFUL",
        "pgtasks.worker.id": worker.worker_id,
    }
    assert run.status.status_code == StatusCode.UNSET
    assert run.events == ()
    assert run.end_time >= run.start_time >= enqueue.end_time


def test_a_failure_is_recorded_on_the_run_span_then_the_retry_then_the_final_failure(
        spans: Spans) -> None:
    with spans.tracer.start_as_current_span("request") as request:
        task = Task.objects.enqueue(tasks.always_fails, "out of paper", max_attempts=2)

    run_worker()  # BACKOFF_BASE is 0 in the tests: the retry is due at once

    assert Task.objects.get(pk=task.pk).status == Status.FAILED
    [enqueue] = spans.wait_for("enqueue", 1)
    first, second = sorted(spans.wait_for("run", 2),
                           key=lambda span: span.attributes["pgtasks.task.attempt"])
    for attempt, span, outcome, status in ((1, first, "retry", "AWAITING_RETRY"),
                                           (2, second, "failed", "FAILED")):
        assert span.context.trace_id == request.get_span_context().trace_id
        assert parent_id(span) == enqueue.context.span_id  # both runs, of one enqueue
        assert span.attributes["pgtasks.task.attempt"] == attempt
        assert span.attributes["pgtasks.task.outcome"] == outcome
        assert span.attributes["pgtasks.task.status"] == status
        assert span.attributes["error.type"] == "RuntimeError"
        assert span.status.status_code == StatusCode.ERROR
        assert span.status.description == "RuntimeError: out of paper"
        [event] = span.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "RuntimeError"
        assert event.attributes["exception.message"] == "out of paper"
    assert first.end_time <= second.start_time


def test_tasks_enqueued_by_a_run_continue_its_trace(spans: Spans) -> None:
    """A pipeline: each stage enqueues the next inside its run span."""
    with spans.tracer.start_as_current_span("request") as request:
        Task.objects.enqueue(tasks.extract, 1)

    run_worker()

    runs = {span.attributes["pgtasks.task.name"].rsplit(".", 1)[1]: span
            for span in spans.wait_for("run", 3)}
    enqueues = spans.wait_for("enqueue", 3)
    assert {span.context.trace_id for span in [*runs.values(), *enqueues]} == {
        request.get_span_context().trace_id}
    by_id = {span.context.span_id: span for span in [*runs.values(), *enqueues]}
    # run load <- enqueue load <- run transform <- enqueue transform <- run extract
    assert by_id[parent_id(runs["load"])].name == "enqueue tests.testapp.tasks.load"
    assert parent_id(by_id[parent_id(runs["load"])]) == runs["transform"].context.span_id
    assert by_id[parent_id(runs["transform"])].name == "enqueue tests.testapp.tasks.transform"
    assert parent_id(by_id[parent_id(runs["transform"])]) == runs["extract"].context.span_id


def test_no_context_is_stored_without_a_current_span(spans: Spans) -> None:
    task = Task.objects.enqueue(tasks.noop)
    assert Task.objects.get(pk=task.pk).metadata == {}
    assert spans.named("enqueue") == []

    # A span current where drain() runs the task is not its parent either.
    with spans.tracer.start_as_current_span("test"):
        drain()

    [run] = spans.wait_for("run", 1)
    assert run.parent is None  # a trace of its own
    assert run.attributes["pgtasks.task.outcome"] == "successful"


def test_drain_runs_the_tasks_of_a_batch_as_children_of_its_one_span(spans: Spans) -> None:
    with spans.tracer.start_as_current_span("request") as request:
        many = Task.objects.enqueue_many(
            [tasks.add.build(1, 2), tasks.noop.build(), tasks.add.build(3, 4, queue="emails")])
        bulk = Task.objects.enqueue_bulk(tasks.add, [(5, 6), {"a": 7, "b": 8}])
    assert drain().succeeded == 5

    batch, copy = sorted(spans.wait_for("enqueue", 2), key=lambda span: span.start_time)
    assert batch.name == "enqueue"  # several task names
    assert batch.attributes["messaging.batch.message_count"] == 3
    assert "messaging.destination.name" not in batch.attributes  # several queues
    assert copy.name == "enqueue tests.testapp.tasks.add"
    assert copy.attributes["messaging.batch.message_count"] == 2
    assert copy.attributes["messaging.destination.name"] == "default"
    runs = spans.wait_for("run", 5)
    parents = {span.attributes["pgtasks.task.id"]: parent_id(span) for span in runs}
    assert parents == {**{t.pk: batch.context.span_id for t in many},
                       **dict.fromkeys(bulk, copy.context.span_id)}
    assert {span.context.trace_id for span in runs} == {request.get_span_context().trace_id}
    rows = Task.objects.filter(pk__in=[*bulk, *(t.pk for t in many)])
    assert {row.metadata[TRACE_CONTEXT_KEY]["traceparent"].split("-")[2] for row in rows} == {
        f"{batch.context.span_id:016x}", f"{copy.context.span_id:016x}"}


def test_a_keyed_enqueue_folded_into_a_waiting_task_keeps_the_first_context(
        spans: Spans) -> None:
    with spans.tracer.start_as_current_span("first"):
        first = Task.objects.enqueue(tasks.add, 1, 2, key="sum")
    with spans.tracer.start_as_current_span("second"):
        again = Task.objects.enqueue(tasks.add, 3, 4, key="sum")
    assert again.pk == first.pk
    assert again.deduplicated
    one, two = sorted(spans.wait_for("enqueue", 2), key=lambda span: span.start_time)
    assert two.attributes["pgtasks.task.deduplicated"] is True
    stored = Task.objects.get(pk=first.pk).metadata[TRACE_CONTEXT_KEY]["traceparent"]
    assert stored.split("-")[2] == f"{one.context.span_id:016x}"


def test_the_enqueue_span_records_an_enqueue_that_fails(spans: Spans) -> None:
    Task.objects.enqueue(tasks.add, 1, 2, key="taken")
    with (spans.tracer.start_as_current_span("request"),
          pytest.raises(InvalidTaskError, match="belongs to a live task of another")):
        Task.objects.enqueue(tasks.noop, key="taken")  # a live task of another name has it
    [enqueue] = spans.wait_for("enqueue", 1)
    assert enqueue.status.status_code == StatusCode.ERROR
    assert enqueue.attributes["error.type"] == "django_pgtasks.exceptions.InvalidTaskError"


def test_django_tasks_backend_enqueues_are_traced(spans: Spans) -> None:
    compat = pytest.importorskip("django_pgtasks.definition.framework")
    from tests.testapp import dj_tasks

    with spans.tracer.start_as_current_span("request") as request:
        result = dj_tasks.add.enqueue(2, 3)
    row = Task.objects.get(pk=int(result.id.partition("@")[0]))
    assert TRACE_CONTEXT_KEY in row.metadata

    run_worker()

    assert dj_tasks.add.get_result(result.id).status == compat.TaskResultStatus.SUCCESSFUL
    [enqueue] = spans.wait_for("enqueue", 1)
    [run] = spans.wait_for("run", 1)
    assert parent_id(enqueue) == request.get_span_context().span_id
    assert parent_id(run) == enqueue.context.span_id
    assert run.attributes["pgtasks.task.outcome"] == "successful"


def test_django_tasks_aenqueue_is_traced_too(spans: Spans) -> None:
    pytest.importorskip("django_pgtasks.definition.framework")
    from asgiref.sync import async_to_sync

    from tests.testapp import dj_tasks

    with spans.tracer.start_as_current_span("request") as request:
        result = async_to_sync(dj_tasks.add.aenqueue)(2, 3)
        assert trace.get_current_span() is request  # the enqueue gave the context back
    [enqueue] = spans.wait_for("enqueue", 1)
    assert parent_id(enqueue) == request.get_span_context().span_id
    row = Task.objects.get(pk=int(result.id.partition("@")[0]))
    assert row.metadata[TRACE_CONTEXT_KEY]["traceparent"].split("-")[2] == (
        f"{enqueue.context.span_id:016x}")


def test_a_run_over_its_time_limit_ends_its_span_when_the_watchdog_fails_it(
        spans: Spans, tmp_path: Path) -> None:
    gate = tmp_path / "gate"  # the handler runs past its 0.5 s limit until the test opens it
    with spans.tracer.start_as_current_span("request"):
        Task.objects.enqueue(tasks.hangs_until, str(gate))
    run_worker()
    [run] = spans.wait_for("run", 1)
    assert run.attributes["pgtasks.task.outcome"] == "failed"
    assert run.status.status_code == StatusCode.ERROR
    assert run.status.description.startswith(
        "django_pgtasks.exceptions.TaskTimeoutError: Task exceeded its time limit")
    # The abandoned handler finishes later; its span was ended once, by the timeout.
    from tests.testapp.models import Execution

    gate.touch()
    wait_until(lambda: Execution.objects.filter(worker="late").exists(), timeout=30,
               what="the abandoned handler to finish")
    assert len(spans.named("run")) == 1


def test_a_run_cut_off_by_the_shutdown_ends_its_span_as_interrupted(
        spans: Spans, tmp_path: Path) -> None:
    gate, started = tmp_path / "gate", tmp_path / "started"
    with spans.tracer.start_as_current_span("request"):
        task = Task.objects.enqueue(tasks.waits_for, str(gate), 30, str(started))
    worker = Worker(concurrency=1, shutdown_grace=0.1)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        wait_until(started.exists, timeout=30, what="the handler to start")
        worker.stop()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        gate.touch()  # the abandoned handler returns
        worker.stop()
        thread.join(30)
    assert Task.objects.get(pk=task.pk).status == Status.READY
    [run] = spans.wait_for("run", 1)
    assert run.attributes["pgtasks.task.outcome"] == "interrupted"
    assert run.status.status_code == StatusCode.ERROR
    assert "shut down before the task finished" in run.status.description


# -- tracing off, absent, unconfigured or broken ----------------------------------------------


def enqueue_in_a_span(tracer: Any) -> Task:
    with tracer.start_as_current_span("request"):
        return Task.objects.enqueue(tasks.add, 1, 1)


def test_tracing_off_in_the_settings_stores_nothing(spans: Spans, settings) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "TRACING": False}
    task = enqueue_in_a_span(spans.tracer)
    assert not tracing.active()
    assert Task.objects.get(pk=task.pk).metadata == {}
    assert drain().succeeded == 1
    assert [span.name for span in spans.all()] == ["request"]


def test_without_opentelemetry_installed_nothing_is_stored_and_tasks_run(
        spans: Spans, monkeypatch: pytest.MonkeyPatch) -> None:
    with spans.tracer.start_as_current_span("request"):
        # As if it were not installed: "from opentelemetry import ..." fails.
        monkeypatch.setitem(sys.modules, "opentelemetry", None)
        tracing.forget()
        task = Task.objects.enqueue(tasks.add, 1, 1)
        assert not tracing.active()
        assert Task.objects.get(pk=task.pk).metadata == {}
        assert drain().succeeded == 1
    assert [span.name for span in spans.all()] == ["request"]


def test_installed_without_an_sdk_tracing_is_off() -> None:
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("a tracer provider was set in this process")
    tracing.forget()
    provider = TracerProvider()  # the caller's own span, from a provider not set globally
    try:
        task = enqueue_in_a_span(provider.get_tracer("tests"))
        assert not tracing.active()
        assert Task.objects.get(pk=task.pk).metadata == {}
        assert drain().succeeded == 1
    finally:
        tracing.forget()
        provider.shutdown()


class Failing(SpanProcessor):
    """A span processor that raises where it is told to: the SDK passes its errors on."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start" and span.name.startswith(("enqueue", "run")):
            raise RuntimeError("broken exporter")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "end" and span.name.startswith(("enqueue", "run")):
            raise RuntimeError("broken exporter")


@pytest.mark.parametrize("where", ["start", "end", "inject", "extract"])
def test_an_error_in_tracing_never_breaks_an_enqueue_or_a_run(
        where: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    provider = TracerProvider()
    provider.add_span_processor(Failing(where))
    configure(monkeypatch, provider)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("broken propagator")

    if where in ("inject", "extract"):
        monkeypatch.setattr(propagate, where, broken)
    caplog.set_level(logging.ERROR, logger="django_pgtasks.tracing")
    try:
        with provider.get_tracer("tests").start_as_current_span("request"):
            ok = Task.objects.enqueue(tasks.add, 1, 2)
            bad = Task.objects.enqueue(tasks.always_fails, max_attempts=1)
        run_worker()
        assert Task.objects.get(pk=ok.pk).status == Status.SUCCESSFUL
        assert Task.objects.get(pk=ok.pk).result == 3
        assert Task.objects.get(pk=bad.pk).status == Status.FAILED
        assert [r for r in caplog.records if r.name == "django_pgtasks.tracing"], (
            "the tracing error was not logged")
        # The enqueues gave the context back, even where their spans broke.
        assert trace.get_current_span() is trace.INVALID_SPAN
    finally:
        tracing.forget()
        provider.shutdown()


def test_the_decision_is_kept_until_a_worker_starts_or_the_settings_change(
        monkeypatch: pytest.MonkeyPatch, settings) -> None:
    calls: list[int] = []
    provider = TracerProvider()

    def counted() -> TracerProvider:
        calls.append(1)
        return provider

    monkeypatch.setattr(trace, "get_tracer_provider", counted)
    tracing.forget()
    try:
        for _ in range(100):
            assert tracing.active()
        assert len(calls) == 1  # decided once
        settings.PGTASKS = {**settings.PGTASKS, "TRACING": False}
        assert not tracing.active()
        settings.PGTASKS = {**settings.PGTASKS, "TRACING": True}
        assert tracing.active()
        run_worker()
        assert len(calls) == 3  # and again when the worker started
    finally:
        tracing.forget()
        provider.shutdown()


def test_an_exception_that_cannot_be_shown_as_text_still_makes_an_error_span(
        spans: Spans) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no str for you")

    assert tracing.active()
    span = spans.tracer.start_span("run x")
    with pytest.raises(ValueError, match="no str for you"):
        # The SDK's own formatting of the event fails, after the status is set; end_run()
        # logs that and ends the span anyway.
        tracing.record_error(span, Unprintable())
    span.end()
    [ended] = spans.wait_for("run", 1)
    assert ended.status.status_code == StatusCode.ERROR
    assert ended.status.description == "Unprintable: <Unprintable that cannot be shown as text>"
    assert ended.attributes["error.type"].endswith("Unprintable")
