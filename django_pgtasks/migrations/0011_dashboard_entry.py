"""The admin dashboard's entry in the admin index: a proxy of the task table; no SQL."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgtasks", "0010_timestamp_array_field"),
    ]

    operations = [
        migrations.CreateModel(
            name="Dashboard",
            fields=[],
            options={
                "verbose_name": "dashboard",
                "verbose_name_plural": "dashboard",
                "proxy": True,
                "default_permissions": (),
                "indexes": [],
                "constraints": [],
            },
            bases=("django_pgtasks.task",),
        ),
    ]
