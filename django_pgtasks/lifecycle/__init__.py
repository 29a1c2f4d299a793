"""Core: every write to a task row and what it promises.

:mod:`.inserts` is the one INSERT path of every enqueue form, :mod:`.claim` takes tasks,
:mod:`.transitions` ends their runs (success, failure, retry, snooze, cancel, interruption,
rescue), :mod:`.operations` holds an operator's changes (retry now, cancel, priority, make
due, delete the finished), :mod:`.release` releases a workflow's children and
:mod:`.waiting` waits for an end. The manager of :class:`~django_pgtasks.models.Task` is the
public face of these modules; they never import the models (the manager passes itself in),
so imports run one way.
"""
