"""The unresolved edges of each parent, indexed: what a release batch and a release mark read.

Built without blocking writes (``CREATE INDEX CONCURRENTLY``, so this migration is not
atomic). Resolved edges, the large majority on a long-lived install, stay out of it.
"""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgtasks", "0016_deferred_release")]

    operations = [
        AddIndexConcurrently(
            model_name="dependency",
            index=models.Index(
                condition=models.Q(("resolved", False)),
                fields=["parent"],
                name="pgtasks_dependency_open_idx",
            ),
        ),
    ]
