"""Which database holds which queue.

A project with one PostgreSQL server needs nothing here: every queue lives in
``PGTASKS["DATABASE"]``. To spread queues over several servers, give a queue its own Django
database alias::

    PGTASKS = {
        "DATABASE": "default",
        "QUEUES": {"default": {}, "emails": {"database": "queue_a"}},
    }

Everything that reads or writes the task table for a queue (enqueue, the worker, rescue, the
admin, ``pgtasks_stats``) asks this module which alias to use.
"""

from __future__ import annotations

from django_pgtasks.conf import pgtasks_settings


def database_for_queue(queue: str) -> str:
    """The database alias that holds ``queue`` (``PGTASKS["DATABASE"]`` unless configured)."""
    queues = pgtasks_settings.QUEUES
    if isinstance(queues, dict):
        options = queues.get(queue) or {}
        if isinstance(options, dict) and options.get("database"):
            return str(options["database"])
    return str(pgtasks_settings.DATABASE)


def queue_databases() -> list[str]:
    """Every alias that holds a task table, ``PGTASKS["DATABASE"]`` first, no repeats."""
    aliases = [str(pgtasks_settings.DATABASE)]
    for queue in pgtasks_settings.queue_names:
        alias = database_for_queue(queue)
        if alias not in aliases:
            aliases.append(alias)
    return aliases


def queues_on(alias: str) -> list[str]:
    """The configured queues held by database ``alias``, in declaration order."""
    return [q for q in pgtasks_settings.queue_names if database_for_queue(q) == alias]
