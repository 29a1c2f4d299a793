"""The suite's own teardown of a transactional test: the emptying of the database
(tests/fast_flush.py), where what ``migrate`` put there survives when a test left it alone and
comes back when it did not; and the connections kept for the next test (tests/kept_connections.py),
each session reset as a new connection finds it."""

from __future__ import annotations

import psycopg
import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction

from django_pgtasks.models import Task
from tests import fast_flush, kept_connections
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


# -- kept connections --------------------------------------------------------------------------

#: What a session shows of the state that a test can leave behind in it.
SESSION_STATE = """
SELECT pg_backend_pid(),
       (SELECT array_agg(name || '=' || setting ORDER BY name) FROM pg_settings
        WHERE source NOT IN ('default', 'configuration file', 'override')),
       current_setting('TimeZone'), session_user = current_user,
       (SELECT count(*) FROM pg_listening_channels()),
       (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
          AND pid = pg_backend_pid()),
       (SELECT count(*) FROM pg_cursors), to_regclass('pg_temp.left_behind')
"""


def session_state() -> tuple:
    with connection.cursor() as cursor:
        cursor.execute(SESSION_STATE)
        return cursor.fetchone()


def test_a_kept_connection_is_reset_as_a_new_one_finds_its_session() -> None:
    connection.close()
    new = session_state()  # a new connection, set up by Django
    assert new[2] == "UTC"
    with connection.cursor() as cursor:
        for statement in ("SET statement_timeout = '1s'", "SET application_name = 'left'",
                          "SET TIME ZONE 'Asia/Tokyo'", "SET ROLE pg_read_all_data",
                          "LISTEN left_behind", "SELECT pg_advisory_lock(4242)",
                          "CREATE TEMP TABLE left_behind (x int)",
                          "DECLARE left_behind CURSOR WITH HOLD FOR SELECT 1"):
            cursor.execute(statement)
    left = session_state()
    assert left[0] == new[0]
    assert left[1:] != new[1:]

    assert kept_connections.reset_session(connection) is True
    assert session_state() == new  # the same server process, as a new connection finds it


def test_a_connection_in_a_transaction_or_lost_is_not_kept() -> None:
    with transaction.atomic():
        assert kept_connections.reset_session(connection) is False
    pid = session_state()[0]
    s = connection.settings_dict
    with psycopg.connect(host=s["HOST"] or None, port=s["PORT"] or None,
                         user=s["USER"] or None, password=s["PASSWORD"] or None,
                         dbname=s["NAME"], autocommit=True) as other:
        # Once it returns true, the backend is gone (it waits up to 10 s for that).
        assert other.execute("SELECT pg_terminate_backend(%s, 10000)", [pid]).fetchone()[0]
    assert kept_connections.reset_session(connection) is False
    connection.close()
