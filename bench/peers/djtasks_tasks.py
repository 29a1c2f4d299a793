"""The django-tasks-db handler of the benchmark: a task that does nothing."""

from django_tasks import task


@task()
def noop() -> None:
    """Does nothing."""
