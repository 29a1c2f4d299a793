from django.db import models


class Execution(models.Model):
    """One row per handler execution, written by the sample handlers in tests.testapp.tasks."""

    task_id = models.BigIntegerField(db_index=True)
    worker = models.CharField(max_length=255, default="")
    attempt = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"execution of task {self.task_id} (attempt {self.attempt})"
