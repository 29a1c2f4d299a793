"""The benchmark's handler: a task that does nothing, so only the queue's own cost shows."""

from django_pgtasks import pgtask


@pgtask(name="bench.noop")
def noop() -> None:
    """Does nothing."""
