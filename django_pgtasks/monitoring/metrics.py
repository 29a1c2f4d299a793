"""Prometheus metrics: a view to mount in ``urls.py``, and counters fed by the task signals.

Needs the optional extra ``django-pgtasks[prometheus]`` (the ``prometheus-client`` library)::

    # urls.py
    from django_pgtasks.monitoring.metrics import metrics_view

    urlpatterns = [..., path("metrics/pgtasks", metrics_view)]

Each scrape runs the bounded queries of :mod:`django_pgtasks.monitoring.dashboard` against every
database
that holds queues and reports, labelled by ``database`` and ``queue``:

- ``pgtasks_tasks_waiting``, ``pgtasks_tasks_scheduled``, ``pgtasks_tasks_running``,
  ``pgtasks_tasks_waiting_for_parents`` (workflows);
- ``pgtasks_oldest_waiting_seconds`` and ``pgtasks_longest_running_seconds``;
- ``pgtasks_tasks_finished_last_hour`` (also by ``status``);
- ``pgtasks_tasks_stuck`` and ``pgtasks_workers`` (by ``state``: alive or lost).

The process that *runs* tasks is a worker, not the web server, so counters of finished tasks
are kept where they happen: :func:`track_tasks` connects receivers of the ``task_enqueued``,
``task_started`` and ``task_finished`` signals that update

- ``pgtasks_tasks_enqueued_total`` (by ``task``, ``queue``),
- ``pgtasks_tasks_started_total`` (by ``task``, ``queue``),
- ``pgtasks_tasks_finished_total`` (by ``task``, ``queue``, ``status``),
- ``pgtasks_task_duration_seconds`` (a histogram, by ``task``, ``queue``),

in the process's default registry. Expose them from the workers with ``prometheus-client``'s
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``), which this view reads when it is set, or
with ``prometheus_client.start_http_server()`` in each worker; see
``docs/howto/monitoring.md``.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        REGISTRY,
        CollectorRegistry,
        Counter,
        Histogram,
        generate_latest,
    )
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        "django_pgtasks.monitoring.metrics needs the prometheus-client library: "
        "pip install 'django-pgtasks[prometheus]'."
    ) from exc

from django_pgtasks.conf import pgtasks_settings
from django_pgtasks.definition import routing
from django_pgtasks.models import Task
from django_pgtasks.monitoring import dashboard
from django_pgtasks.signals import task_enqueued, task_finished, task_started

#: Buckets of the run-time histogram, in seconds: from 5 ms to 10 minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300,
                    600)


class QueueCollector(Collector):
    """Gauges of the queues, read from the database at each scrape."""

    def __init__(self, databases: list[str] | None = None) -> None:
        self.databases = databases

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["database", "queue"]
        waiting = GaugeMetricFamily(
            "pgtasks_tasks_waiting", "Tasks due now and not claimed (the backlog).", labels=labels)
        scheduled = GaugeMetricFamily(
            "pgtasks_tasks_scheduled", "Tasks waiting for a later run_after (delays, backoff).",
            labels=labels)
        running = GaugeMetricFamily(
            "pgtasks_tasks_running", "Tasks claimed by a worker.", labels=labels)
        blocked = GaugeMetricFamily(
            "pgtasks_tasks_waiting_for_parents",
            "Tasks waiting for the tasks they depend on to end (workflows).", labels=labels)
        oldest = GaugeMetricFamily(
            "pgtasks_oldest_waiting_seconds",
            "Seconds since the oldest waiting task became due (0 when none waits).",
            labels=labels)
        longest = GaugeMetricFamily(
            "pgtasks_longest_running_seconds",
            "Seconds since the longest running task was claimed (0 when none runs).",
            labels=labels)
        finished = GaugeMetricFamily(
            "pgtasks_tasks_finished_last_hour",
            "Tasks that ended in the last 60 minutes, by final status.",
            labels=[*labels, "status"])
        stuck = GaugeMetricFamily(
            "pgtasks_tasks_stuck",
            "Running tasks whose worker is lost or whose lease expired.", labels=["database"])
        workers = GaugeMetricFamily(
            "pgtasks_workers", "Registered worker processes, by liveness.",
            labels=["database", "state"])
        for alias in self.databases or routing.queue_databases():
            now = dashboard.db_now(alias)
            for q in dashboard.queue_rows(alias, now):
                key = [alias, q.queue]
                waiting.add_metric(key, q.waiting)
                scheduled.add_metric(key, q.scheduled)
                running.add_metric(key, q.running)
                blocked.add_metric(key, q.waiting_for_parents)
                oldest.add_metric(key, q.oldest_waiting or 0.0)
                longest.add_metric(key, q.longest_running or 0.0)
                for status, n in (("SUCCESSFUL", q.succeeded_last_hour),
                                  ("FAILED", q.failed_last_hour),
                                  ("CANCELLED", q.cancelled_last_hour)):
                    finished.add_metric([*key, status], n)
            stuck.add_metric([alias], Task.objects.using(alias).stuck().count())
            rows = dashboard.workers(alias)
            lost = sum(1 for w in rows if w.lost)
            workers.add_metric([alias, "alive"], len(rows) - lost)
            workers.add_metric([alias, "lost"], lost)
        yield from (waiting, scheduled, running, blocked, oldest, longest, finished, stuck,
                    workers)


# -- counters fed by the signals ------------------------------------------------------------

_task_metrics: dict[str, Any] = {}


def task_metrics() -> dict[str, Any]:
    """The signal-fed counters and histogram (created once, in the default registry)."""
    if not _task_metrics:
        labels = ["task", "queue"]
        _task_metrics.update(
            enqueued=Counter("pgtasks_tasks_enqueued", "Tasks enqueued by this process.",
                             labels),
            started=Counter("pgtasks_tasks_started", "Task attempts started by this process.",
                            labels),
            finished=Counter("pgtasks_tasks_finished",
                             "Task attempts whose outcome this process recorded.",
                             [*labels, "status"]),
            duration=Histogram("pgtasks_task_duration_seconds",
                               "Run time of task attempts in this process.", labels,
                               buckets=DURATION_BUCKETS),
        )
    return _task_metrics


def _on_enqueued(sender: Any, task: Task, **kwargs: Any) -> None:
    task_metrics()["enqueued"].labels(task.name, task.queue).inc()


def _on_started(sender: Any, task: Task, **kwargs: Any) -> None:
    task_metrics()["started"].labels(task.name, task.queue).inc()


def _on_finished(sender: Any, task: Task, status: str, duration: float, **kwargs: Any) -> None:
    metrics = task_metrics()
    metrics["finished"].labels(task.name, task.queue, str(status)).inc()
    metrics["duration"].labels(task.name, task.queue).observe(duration)


def track_tasks() -> None:
    """Count enqueued, started and finished tasks of this process from the task signals.

    Call it once per process, for instance in your ``AppConfig.ready()``; calling it again
    changes nothing.
    """
    task_metrics()
    task_enqueued.connect(_on_enqueued, sender=Task, dispatch_uid="pgtasks_metrics_enqueued")
    task_started.connect(_on_started, sender=Task, dispatch_uid="pgtasks_metrics_started")
    task_finished.connect(_on_finished, sender=Task, dispatch_uid="pgtasks_metrics_finished")


def registry_for_scrape(databases: list[str] | None = None) -> CollectorRegistry:
    """The queue gauges, plus the signal-fed counters: those of every process writing to
    ``PROMETHEUS_MULTIPROC_DIR`` when it is set, else those of this process."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector(databases))
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    elif _task_metrics:
        registry.register(_DefaultRegistryTaskMetrics())
    return registry


class _DefaultRegistryTaskMetrics(Collector):
    """This process's signal-fed metrics, taken from the default registry."""

    def collect(self) -> Iterator[Any]:
        for metric in REGISTRY.collect():
            if metric.name.startswith("pgtasks_"):
                yield metric


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The metrics in Prometheus's text format (``GET`` only; mount it in ``urls.py``).

    Open to anyone who reaches it unless ``PGTASKS["METRICS_TOKEN"]`` or
    ``PGTASKS["METRICS_PERMISSION"]`` is set: then it answers only a request with
    ``Authorization: Bearer <the token>`` or of a logged-in user with the permission, and
    refuses the others with 401 or 403 (:func:`refusal`).
    """
    refused = refusal(request)
    if refused is not None:
        return refused
    if request.method not in ("GET", "HEAD"):
        response = HttpResponse(status=405)
        response["Allow"] = "GET, HEAD"
        return response
    return HttpResponse(generate_latest(registry_for_scrape()), content_type=CONTENT_TYPE_LATEST)


#: The protection space named in the ``WWW-Authenticate`` challenge of a 401.
REALM = "django-pgtasks metrics"


def refusal(request: HttpRequest) -> HttpResponse | None:
    """``None`` if ``request`` may read the metrics, else the response that refuses it.

    With ``PGTASKS["METRICS_TOKEN"]`` set, a request whose ``Authorization`` header is
    ``Bearer <token>`` (one of the tokens, compared in constant time) may; with
    ``PGTASKS["METRICS_PERMISSION"]`` set, so may a logged-in user who has that permission.
    With neither set, every request may. A refusal is 401 with a ``Bearer`` challenge when a
    token would do and none or a wrong one was sent, else 403 (a logged-in user without the
    permission, or an anonymous request when only the permission would do).
    """
    token, permission = pgtasks_settings.METRICS_TOKEN, pgtasks_settings.METRICS_PERMISSION
    if token is None and permission is None:
        return None
    tokens = [token] if isinstance(token, str) else list(token or ())
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    bearer = given.strip().encode() if scheme.lower() == "bearer" else b""
    if bearer and any(isinstance(t, str) and t and hmac.compare_digest(bearer, t.encode())
                      for t in tokens):
        return None
    user = getattr(request, "user", None)
    authenticated = user is not None and user.is_authenticated
    if permission and authenticated and user.has_perm(permission):
        return None
    if tokens and (bearer or not authenticated):
        response = HttpResponse(status=401)
        error = ', error="invalid_token"' if bearer else ""
        response["WWW-Authenticate"] = f'Bearer realm="{REALM}"{error}'
        return response
    return HttpResponse(status=403)
