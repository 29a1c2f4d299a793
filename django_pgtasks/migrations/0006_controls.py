"""Queue controls: per-key concurrency, rate limits, pause/resume, cooperative cancel."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_pgtasks", "0005_archive_schedules_keys")]

    operations: list = []
