"""A migrated database has exactly the functions and triggers of django_pgtasks/sql/.

Each definition of sql/ is created again in a transaction that is rolled back, and what the
server then shows of it (``pg_get_functiondef``, ``pg_get_triggerdef``) must be what it showed
of the migrated one: the server prints both the same way, whatever its version.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from django_pgtasks import sql

pytestmark = pytest.mark.django_db(transaction=True)

FUNCTIONS_SQL = """
    SELECT p.proname, pg_get_functiondef(p.oid)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = current_schema() AND p.proname LIKE 'pgtasks%%'
"""
# Triggers of the tables themselves (not the copies partitions get of a parent's).
TRIGGERS_SQL = """
    SELECT t.tgname || ' on ' || c.relname, pg_get_triggerdef(t.oid)
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = current_schema() AND c.relname LIKE 'pgtasks%%'
      AND NOT t.tgisinternal AND t.tgparentid = 0
"""


def shown() -> dict[str, str]:
    with connection.cursor() as cursor:
        cursor.execute(FUNCTIONS_SQL)
        found = {f"function {name}": text for name, text in cursor.fetchall()}
        cursor.execute(TRIGGERS_SQL)
        found.update((f"trigger {key}", text) for key, text in cursor.fetchall())
    return found


def test_the_migrated_database_has_exactly_the_definitions_of_sql() -> None:
    migrated = shown()
    definitions = sql.definitions()
    assert sorted(definitions) == sorted(migrated)
    with transaction.atomic():
        with connection.cursor() as cursor:
            for key, text in definitions.items():
                if key.startswith("trigger "):
                    name, _, table = key.removeprefix("trigger ").partition(" on ")
                    cursor.execute(f"DROP TRIGGER {name} ON {table}")
                cursor.execute(text)
        recreated = shown()
        transaction.set_rollback(True)
    different = [key for key in definitions if recreated[key] != migrated[key]]
    assert different == [], "\n\n".join(
        f"{key}\n-- migrated:\n{migrated[key]}\n-- sql/:\n{recreated[key]}" for key in different)


def test_every_definition_of_sql_is_named_once_and_ends_with_its_statement() -> None:
    definitions = sql.definitions()
    assert len(definitions) > 20
    for key, text in definitions.items():
        kind, name = key.split(" ", 2)[:2]
        assert text.startswith(("CREATE OR REPLACE FUNCTION", "CREATE TRIGGER",
                                "CREATE CONSTRAINT TRIGGER")), key
        assert f" {name}" in text.split("\n", 1)[0], key
        assert kind in text.split("\n", 1)[0].lower(), key
