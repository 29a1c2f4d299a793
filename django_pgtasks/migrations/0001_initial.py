import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Task",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "name",
                    models.CharField(
                        help_text="Registered handler.", max_length=255, verbose_name="task name"
                    ),
                ),
                (
                    "queue",
                    models.CharField(default="default", max_length=100, verbose_name="queue"),
                ),
                (
                    "args",
                    models.JSONField(blank=True, default=list, verbose_name="positional arguments"),
                ),
                (
                    "kwargs",
                    models.JSONField(blank=True, default=dict, verbose_name="keyword arguments"),
                ),
                (
                    "priority",
                    models.SmallIntegerField(
                        default=100,
                        help_text="0 to 200; higher runs first; default 100.",
                        verbose_name="priority",
                    ),
                ),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("READY", "Ready"),
                            ("RUNNING", "Running"),
                            ("AWAITING_RETRY", "Awaiting retry"),
                            ("SUCCESSFUL", "Successful"),
                            ("FAILED", "Failed"),
                            ("CANCELLED", "Cancelled"),
                        ],
                        default="READY",
                        max_length=16,
                        verbose_name="status",
                    ),
                ),
                (
                    "attempt",
                    models.PositiveIntegerField(default=0, verbose_name="attempts started"),
                ),
                (
                    "max_attempts",
                    models.PositiveIntegerField(default=3, verbose_name="max attempts"),
                ),
                (
                    "run_after",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        help_text="Not claimed before this time.",
                        verbose_name="run after",
                    ),
                ),
                (
                    "locked_by",
                    models.CharField(
                        blank=True,
                        help_text="Worker that holds (or last held) the task.",
                        max_length=255,
                        null=True,
                        verbose_name="worker",
                    ),
                ),
                (
                    "locked_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="lease taken"),
                ),
                (
                    "started_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="attempt started"),
                ),
                (
                    "finished_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="attempt finished"),
                ),
                ("error_text", models.TextField(blank=True, default="", verbose_name="error")),
                ("result", models.JSONField(blank=True, null=True, verbose_name="result")),
                (
                    "key",
                    models.CharField(
                        blank=True,
                        default=None,
                        max_length=255,
                        null=True,
                        verbose_name="deduplication key",
                    ),
                ),
                (
                    "stage",
                    models.CharField(
                        blank=True, default=None, max_length=100, null=True, verbose_name="stage"
                    ),
                ),
                ("metadata", models.JSONField(blank=True, default=dict, verbose_name="metadata")),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(), verbose_name="created"
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(), verbose_name="updated"
                    ),
                ),
            ],
            options={
                "verbose_name": "task",
                "verbose_name_plural": "tasks",
                "db_table": "pgtasks_task",
                "indexes": [
                    models.Index(
                        condition=models.Q(("status__in", ("READY", "AWAITING_RETRY"))),
                        fields=["queue", "-priority", "run_after", "id"],
                        name="pgtasks_task_claim_idx",
                    ),
                    models.Index(
                        condition=models.Q(("status", "RUNNING")),
                        fields=["locked_at"],
                        name="pgtasks_task_running_idx",
                    ),
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("priority__gte", 0), ("priority__lte", 200)),
                        name="pgtasks_task_priority_range",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("max_attempts__gte", 1)),
                        name="pgtasks_task_max_attempts_min",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                [
                                    "READY",
                                    "RUNNING",
                                    "AWAITING_RETRY",
                                    "SUCCESSFUL",
                                    "FAILED",
                                    "CANCELLED",
                                ],
                            )
                        ),
                        name="pgtasks_task_status_valid",
                    ),
                ],
            },
        ),
        # A queue table sees an update for every state change, so let autovacuum visit it after
        # 1% of its rows changed instead of the default 20%, and analyze it as often: the claim
        # plan depends on fresh statistics about the pending range. See docs/howto/production.md.
        migrations.RunSQL(
            sql="ALTER TABLE pgtasks_task SET (autovacuum_vacuum_scale_factor = 0.01, "
            "autovacuum_vacuum_threshold = 1000, autovacuum_analyze_scale_factor = 0.02, "
            "autovacuum_vacuum_cost_delay = 1)",
            reverse_sql="ALTER TABLE pgtasks_task RESET (autovacuum_vacuum_scale_factor, "
            "autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor, "
            "autovacuum_vacuum_cost_delay)",
        ),
    ]
