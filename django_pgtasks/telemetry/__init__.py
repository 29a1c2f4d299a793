"""What the queue tells the outside: OpenTelemetry spans (:mod:`.tracing`) and the worker's
console (:mod:`.console`). Metrics and the dashboard read the tables:
:mod:`django_pgtasks.monitoring`.
"""
