"""Schedules made in the admin: the arguments, queue, priority and source of a schedule row."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgtasks", "0011_dashboard_entry"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedule",
            name="args",
            field=models.JSONField(
                blank=True,
                db_default=models.Value([], models.JSONField()),
                default=list,
                verbose_name="positional arguments",
            ),
        ),
        migrations.AddField(
            model_name="schedule",
            name="kwargs",
            field=models.JSONField(
                blank=True,
                db_default=models.Value({}, models.JSONField()),
                default=dict,
                verbose_name="keyword arguments",
            ),
        ),
        migrations.AddField(
            model_name="schedule",
            name="priority",
            field=models.SmallIntegerField(
                blank=True,
                help_text="Empty: the task's own priority.",
                null=True,
                verbose_name="priority",
            ),
        ),
        migrations.AddField(
            model_name="schedule",
            name="queue",
            field=models.CharField(
                blank=True,
                help_text="Empty: the task's own queue.",
                max_length=100,
                null=True,
                verbose_name="queue",
            ),
        ),
        migrations.AddField(
            model_name="schedule",
            name="source",
            field=models.CharField(
                choices=[("code", "declared in code"), ("database", "made in the admin")],
                db_default="code",
                default="code",
                max_length=16,
                verbose_name="source",
            ),
        ),
    ]
