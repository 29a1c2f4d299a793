"""The queue-control columns point at the project's own field class (models.fields); no SQL."""

from django.db import migrations

import django_pgtasks.models.fields


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgtasks", "0009_claims"),
    ]

    operations = [
        migrations.AlterField(
            model_name="keyratelimit",
            name="rate_starts",
            field=django_pgtasks.models.fields.TimestampArrayField(
                blank=True,
                default=list,
                editable=False,
                help_text="Start times of the latest tasks, kept by the claim for the rate limit.",
                verbose_name="recent starts",
            ),
        ),
        migrations.AlterField(
            model_name="queuecontrol",
            name="rate_starts",
            field=django_pgtasks.models.fields.TimestampArrayField(
                blank=True,
                default=list,
                editable=False,
                help_text="Start times of the latest tasks, kept by the claim for the rate limit.",
                verbose_name="recent starts",
            ),
        ),
    ]
