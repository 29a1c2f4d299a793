"""The system check that asks the server: does one worker fit in its connections?

The checks of the settings alone are in ``tests/unit/test_checks.py``."""

from __future__ import annotations

import pytest


@pytest.mark.django_db
def test_a_concurrency_the_server_cannot_serve_is_a_warning(settings) -> None:
    from django.db import connection

    from django_pgtasks.checks import check_connection_budget

    assert check_connection_budget(databases=["default"]) == []  # the defaults fit
    settings.PGTASKS = {"CONCURRENCY": 200}
    with connection.cursor() as cursor:
        cursor.execute("SHOW max_connections")
        max_connections = int(cursor.fetchone()[0])
    assert max_connections < 202, "the test expects a server that cannot take 202 clients"
    [warning] = check_connection_budget(databases=["default"])
    assert warning.id == "django_pgtasks.W050"
    assert "CONCURRENCY'] = 200 threads needs up to 204 connections" in warning.msg
    assert f"max_connections {max_connections} minus" in warning.msg
    assert "'pool'" in warning.hint
    # Only `check --database` queries the server, like Django's own database checks.
    assert check_connection_budget(databases=None) == []


