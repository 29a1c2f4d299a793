"""Which worker serves which database (``worker/startup.worker_groups``): ``run_pgtasks``
starts one group of workers per database that holds the queues it serves."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_pgtasks.worker.startup import worker_groups

# "not_postgres" is an alias of the test settings: enough for where workers go.
SPREAD = {"QUEUES": {"default": {}, "emails": {"database": "not_postgres"},
                     "urgent": {}, "reports": {"database": "not_postgres"}}}


def groups(queues: list[str] | None = None, database: str | None = None) -> list[dict]:
    notes: list[str] = []
    found = worker_groups({"queues": queues, "using": database, "concurrency": 4}, database,
                          notes.append)
    if notes:
        found.append({"notes": notes})
    return found


def test_one_database_one_group_with_every_queue() -> None:
    assert groups() == [{"queues": ["default", "emails", "urgent"], "using": "default",
                         "concurrency": 4}]


@override_settings(PGTASKS=SPREAD)
def test_one_group_per_database_each_with_its_queues() -> None:
    assert groups() == [
        {"queues": ["default", "urgent"], "using": "default", "concurrency": 4},
        {"queues": ["emails", "reports"], "using": "not_postgres", "concurrency": 4},
    ]


@override_settings(PGTASKS=SPREAD)
@pytest.mark.parametrize(("queues", "expected"), [
    (["emails"], [("not_postgres", ["emails"])]),
    (["urgent", "reports"], [("default", ["urgent"]), ("not_postgres", ["reports"])]),
    (["reports", "emails"], [("not_postgres", ["reports", "emails"])]),  # the order given
])
def test_the_queues_asked_for_go_to_their_databases(
    queues: list[str], expected: list[tuple[str, list[str]]],
) -> None:
    assert [(g["using"], g["queues"]) for g in groups(queues)] == expected


@override_settings(PGTASKS=SPREAD)
def test_database_serves_the_queues_it_holds() -> None:
    assert groups(database="not_postgres") == [
        {"queues": ["emails", "reports"], "using": "not_postgres", "concurrency": 4}]


@override_settings(PGTASKS=SPREAD)
def test_a_database_that_holds_no_queue_serves_them_all() -> None:
    """For tasks put there with ``enqueue(..., using=...)``."""
    assert groups(database="elsewhere") == [
        {"queues": None, "using": "elsewhere", "concurrency": 4}]


@override_settings(PGTASKS=SPREAD)
def test_a_queue_asked_of_a_database_that_does_not_hold_it_is_served_with_a_note() -> None:
    [group, notes] = groups(["default", "emails"], database="not_postgres")
    assert group["queues"] == ["default", "emails"]
    assert notes == {"notes": [
        "Queue(s) default are configured on another database than 'not_postgres' "
        "(PGTASKS['QUEUES']); serving the tasks they have there."]}


@override_settings(PGTASKS={"QUEUES": {"default": {}, "emails": {"database": "nowhere"}}})
def test_a_queue_on_an_alias_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"Queue\(s\) emails are on database "
                                                   r"'nowhere', which is not an alias in "
                                                   r"DATABASES \(default, "):
        groups()


def test_a_queue_not_configured_goes_to_the_task_database() -> None:
    assert groups(["unknown"]) == [{"queues": ["unknown"], "using": "default",
                                    "concurrency": 4}]
