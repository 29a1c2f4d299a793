"""Core: every write to a task row and what it promises.

:mod:`.claim` takes tasks, :mod:`.transitions` ends their runs (success, failure, retry,
snooze, cancel, interruption, rescue), :mod:`.waiting` waits for an end. The manager of
:class:`~django_pgtasks.models.Task` is the public face of these modules; they never import
the models (the manager passes itself in), so imports run one way.
"""
