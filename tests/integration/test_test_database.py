"""The suite's own emptying of the database after a transactional test (tests/fast_flush.py):
what ``migrate`` put there survives when a test left it alone, and comes back when it did not.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType

from django_pgtasks.models import Task
from tests import fast_flush
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def empty_and_refill() -> bool:
    """What a transactional test's teardown does; whether the kept tables were emptied."""
    refilled = fast_flush._emptied("default")
    assert refilled is not None
    if refilled:
        fast_flush.emit_post_migrate_signal(verbosity=0, interactive=False, db="default")
        fast_flush._remember_as_migrated("default")
    return refilled


def test_the_rows_of_migrate_are_kept_and_every_other_row_deleted() -> None:
    empty_and_refill()  # as after the teardown of an earlier test
    content_types = set(ContentType.objects.values_list("pk", "app_label", "model"))
    permissions = set(Permission.objects.values_list("pk", "codename"))
    tasks.noop.enqueue()

    assert empty_and_refill() is False
    assert not Task.objects.exists()
    assert set(ContentType.objects.values_list("pk", "app_label", "model")) == content_types
    assert set(Permission.objects.values_list("pk", "codename")) == permissions


@pytest.mark.parametrize("change", ["delete", "rename", "add"])
def test_a_test_that_changed_them_gets_them_back_as_migrate_made_them(change: str) -> None:
    empty_and_refill()
    codenames = set(Permission.objects.values_list("codename", flat=True))
    view_task = Permission.objects.get(codename="view_task")
    if change == "delete":
        view_task.delete()
    elif change == "rename":
        Permission.objects.filter(pk=view_task.pk).update(codename="renamed")
    else:
        Permission.objects.create(codename="extra", name="extra",
                                  content_type=view_task.content_type)

    assert empty_and_refill() is True
    assert set(Permission.objects.values_list("codename", flat=True)) == codenames
