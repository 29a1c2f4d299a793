"""Schedules made in the admin: validated like the scheduler would run them, picked up by
running workers within a pass, each planned run produced once across concurrent workers.

Transactional tests on real PostgreSQL, so that ``now()`` advances as in production.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse

from django_pgtasks.definition.recurrence import Cron
from django_pgtasks.models import Schedule, Task
from django_pgtasks.scheduling import job as scheduling
from django_pgtasks.scheduling.declarations import planned_at
from tests.helpers import race_scheduler_passes, wait_until

pytestmark = [pytest.mark.django_db(transaction=True),
              pytest.mark.usefixtures("fresh_scheduler_state")]

REPORT = "tests.testapp.periodic.report"
TICK = "tests.testapp.periodic.tick"
ADD = reverse("admin:django_pgtasks_schedule_add")


def form(**fields: Any) -> dict[str, Any]:
    data = {"name": "reports", "task_name": REPORT, "spec": "every 1h", "timezone": "UTC",
            "enabled": "on", "args": '["eu"]', "kwargs": '{"full": true}', "queue": "emails",
            "priority": "150"}
    data.update(fields)
    return {key: value for key, value in data.items() if value is not None}


def change_url(schedule: Schedule) -> str:
    return reverse("admin:django_pgtasks_schedule_change", args=[schedule.pk])


def db_now() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_a_schedule_made_in_the_admin_runs_what_it_says(admin_client: Client) -> None:
    before = db_now()
    response = admin_client.post(ADD, form())
    assert response.status_code == 302, response.content.decode()[:2000]
    schedule = Schedule.objects.get(name="reports")
    assert (schedule.source, schedule.spec, schedule.args, schedule.kwargs, schedule.queue,
            schedule.priority) == ("database", "every 1h", ["eu"], {"full": True}, "emails", 150)
    assert before <= schedule.next_run_at <= db_now()  # a period: first due at once

    [task_id] = scheduling.run_scheduler()
    task = Task.objects.get(pk=task_id)
    assert (task.name, task.args, task.kwargs, task.queue, task.priority) == (
        REPORT, ["eu"], {"full": True}, "emails", 150)
    assert task.metadata["schedule"] == "reports"
    assert planned_at(task) == schedule.next_run_at
    schedule.refresh_from_db()
    assert schedule.last_task_id == task_id
    assert schedule.next_run_at == planned_at(task) + timedelta(hours=1)
    assert scheduling.run_scheduler() == []  # not due again for an hour


@pytest.mark.parametrize(("fields", "field", "message"), [
    ({"spec": "61 * * * *"}, "spec", "Invalid cron expression '61 * * * *'"),
    ({"spec": "every hour"}, "spec", "'every hour' is not a period"),
    ({"spec": "every 0s"}, "spec", "must be positive"),
    ({"task_name": "nope.not_a_task"}, "task_name", "nope.not_a_task"),
    ({"timezone": "Mars/Olympus"}, "timezone", "Unknown time zone 'Mars/Olympus'"),
    ({"args": '["eu", "more", "than", "fits"]'}, None, "the arguments do not match"),
    ({"args": '{"a": 1}'}, "args", "JSON array"),
    ({"kwargs": '{"queue": "x"}'}, "kwargs", "Reserved name(s): queue"),
    ({"args": '["\\u0000"]'}, "args", "NUL"),
    ({"queue": "nowhere"}, "queue", "nowhere"),
    ({"priority": "999"}, "priority", "Priority must be an integer from"),
    ({"priority": "99999999"}, "priority", ""),
    ({"name": ""}, "name", ""),
    # A name in an installed app whose module does not exist: HandlerImportError.
    ({"task_name": "tests.testapp.nosuchmodule.run"}, "task_name",
     "The module 'tests.testapp.nosuchmodule' of the task"),
    # An attribute of a module that is not a task (nor a module): HandlerImportError too.
    ({"task_name": "tests.testapp.models.Execution.objects"}, "task_name",
     "The module 'tests.testapp.models.Execution' of the task"),
    ({"task_name": "tests.testapp.periodic.Execution"}, "task_name",
     "No task handler is registered under the name 'tests.testapp.periodic.Execution'"),
    # What Python's json reads but PostgreSQL or the page cannot take, on its own field.
    ({"args": '["\\ud800"]'}, "args", "args[0] contains a lone surrogate"),
    ({"kwargs": '{"full": "\\udfff"}'}, "kwargs", "'full' contains a lone surrogate"),
    ({"kwargs": '{"\\ud800": 1}'}, "kwargs", "Task argument name '\\ud800' contains a lone"),
    # Too deep to read, or (Python 3.13 reads it) past MAX_PAYLOAD_DEPTH: nested either way.
    ({"args": "[" * 2000 + "]" * 2000}, "args", "nested"),
    ({"kwargs": '{"a": ' + "[" * 40 + "]" * 40 + "}"}, "kwargs",
     'nested more than 32 levels deep (PGTASKS["MAX_PAYLOAD_DEPTH"])'),
    ({"args": "[" + "9" * 5000 + "]"}, "args", "an integer of more than 4300 digits"),
    ({"args": "[NaN]"}, "args", "NaN and Infinity are not valid JSON"),
    ({"args": "[1e400]"}, "args", "NaN and Infinity are not valid JSON"),
    # NUL characters in text, numbers and times out of range.
    ({"task_name": REPORT + "\x00"}, "task_name", "Null characters are not allowed"),
    ({"spec": "every 1h\x00"}, "spec", "Null characters are not allowed"),
    ({"timezone": "UTC\x00"}, "timezone", "Null characters are not allowed"),
    ({"queue": "emails\x00"}, "queue", "Null characters are not allowed"),
    ({"priority": "9" * 5000}, "priority", "Enter a whole number"),
    ({"spec": "every 99999999999d"}, "spec", "is too long"),
    ({"spec": "every 3000000d"}, "spec", "plans its next run after the year 9999"),
])
def test_a_bad_schedule_is_a_form_error_and_nothing_is_written(
        admin_client: Client, fields: dict[str, str], field: str | None, message: str) -> None:
    response = admin_client.post(ADD, form(**fields))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    key = field or "__all__"
    assert key in errors, errors
    assert message in " ".join(errors[key]), errors
    assert not Schedule.objects.exists()


def test_refused_arguments_are_shown_again_as_typed(admin_client: Client) -> None:
    # The page is encoded as UTF-8: a lone surrogate is shown as its JSON escape, and a text
    # json cannot read as it was typed.
    response = admin_client.post(ADD, form(args='["\\ud800"]',
                                           kwargs='{"a": ' + "9" * 5000 + "}"))
    assert response.status_code == 200
    page = response.content.decode()
    assert '[&quot;\\ud800&quot;]</textarea>' in page
    assert '{&quot;a&quot;: ' + "9" * 5000 + "}</textarea>" in page


def test_a_name_declared_in_code_is_refused(admin_client: Client, settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "SCHEDULE": {
        "nightly": {"task": TICK, "schedule": "0 3 * * *"}}}
    response = admin_client.post(ADD, form(name="nightly"))
    assert "is declared in code" in " ".join(response.context["adminform"].form.errors["name"])
    assert not Schedule.objects.exists()


def test_an_edit_applies_at_the_next_pass(admin_client: Client) -> None:
    admin_client.post(ADD, form(spec="every 1s"))
    schedule = Schedule.objects.get(name="reports")
    [first] = scheduling.run_scheduler()

    # New arguments: the plan is kept, the next run takes them.
    response = admin_client.post(change_url(schedule), form(spec="every 1s", args='["us"]'))
    assert response.status_code == 302
    planned = Schedule.objects.get(pk=schedule.pk).next_run_at
    assert planned == Schedule.objects.get(pk=schedule.pk).next_run_at
    wait_until(lambda: bool(scheduling.run_scheduler()), 10, "the next run")
    second = Task.objects.exclude(pk=first).get()
    assert (second.args, planned_at(second)) == (["us"], planned)

    # A new spec plans afresh, on the database clock.
    admin_client.post(change_url(schedule), form(spec="0 3 * * *", args='["us"]'))
    schedule.refresh_from_db()
    assert schedule.spec == "0 3 * * *"
    assert schedule.next_run_at == Cron("0 3 * * *").next_after(db_now(), parse_tz("UTC"))

    # Disabled: no run even when due.
    admin_client.post(change_url(schedule), form(spec="every 1s", enabled=None))
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=db_now() - timedelta(hours=1))
    assert scheduling.run_scheduler() == []
    # Enabled again: planned afresh, a period after its last run (or now, if later).
    response = admin_client.post(change_url(schedule), form(spec="every 1s"))
    assert response.status_code == 302
    schedule.refresh_from_db()
    assert schedule.enabled
    assert schedule.next_run_at == max(schedule.last_run_at + timedelta(seconds=1), db_now()) \
        or schedule.next_run_at <= db_now()
    wait_until(lambda: bool(scheduling.run_scheduler()), 10, "the run after enabling")


def parse_tz(name: str) -> Any:
    from django_pgtasks.definition.recurrence import zone

    return zone(name)


def test_code_rows_stay_read_only_and_admin_rows_can_be_deleted(
        admin_client: Client, settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "SCHEDULE": {
        "nightly": {"task": TICK, "schedule": "0 3 * * *"}}}
    scheduling.run_scheduler()
    admin_client.post(ADD, form())
    code, made = Schedule.objects.get(name="nightly"), Schedule.objects.get(name="reports")
    assert code.source == "code"
    assert b'name="_save"' not in admin_client.get(change_url(code)).content
    assert b'name="_save"' in admin_client.get(change_url(made)).content
    response = admin_client.post(change_url(code), form(name="nightly", spec="* * * * *"))
    assert response.status_code == 403
    assert Schedule.objects.get(pk=code.pk).spec == "0 3 * * *"
    delete = "admin:django_pgtasks_schedule_delete"
    assert admin_client.get(reverse(delete, args=[code.pk])).status_code == 403
    assert admin_client.post(reverse(delete, args=[made.pk]), {"post": "yes"}).status_code == 302
    assert list(Schedule.objects.values_list("name", flat=True)) == ["nightly"]


def test_a_declaration_in_code_takes_over_a_row_of_its_name(settings: Any) -> None:
    Schedule.objects.create(name="nightly", task_name=REPORT, spec="every 1s", source="database",
                            args=["eu"], next_run_at=db_now() + timedelta(hours=1))
    settings.PGTASKS = {**settings.PGTASKS, "SCHEDULE": {
        "nightly": {"task": TICK, "schedule": "0 3 * * *"}}}
    scheduling.run_scheduler()
    row = Schedule.objects.get(name="nightly")
    assert (row.source, row.task_name, row.spec) == ("code", TICK, "0 3 * * *")


def test_the_missed_run_policy_applies(admin_client: Client, settings: Any) -> None:
    settings.PGTASKS = {**settings.PGTASKS, "MISSED_RUNS": "all"}
    admin_client.post(ADD, form(spec="every 1m"))
    Schedule.objects.update(next_run_at=db_now() - timedelta(minutes=4, seconds=30))
    assert len(scheduling.run_scheduler()) == 5  # -4m30s, -3m30s, ..., -30s


@pytest.mark.slow
def test_eight_threads_racing_produce_each_run_once(admin_client: Client, settings) -> None:
    # Every planned time gets its run, even those a stall of the machine let pass ("all"):
    # the planned times then follow each other with no gap, each once.
    settings.PGTASKS = {**settings.PGTASKS, "MISSED_RUNS": "all"}
    admin_client.post(ADD, form(spec="every 0.2s", args='["eu"]'))
    race_scheduler_passes(until=lambda: Task.objects.filter(name=REPORT).count() >= 10)
    runs = sorted(planned_at(task) for task in Task.objects.filter(name=REPORT))
    assert len(runs) >= 10
    assert max(Counter(runs).values()) == 1
    assert all(b - a == timedelta(seconds=0.2) for a, b in itertools.pairwise(runs))


@pytest.mark.slow
def test_running_workers_pick_up_a_new_schedule_and_its_edits(
        admin_client: Client, start_command: Any) -> None:
    from tests.helpers import stop_processes

    workers = [start_command("run_pgtasks", "--worker-id", f"sched-{i}", "--concurrency", "2")
               for i in range(3)]
    admin_client.post(ADD, form(spec="every 1s", queue="default"))

    def ran(args: list[str]) -> bool:
        return Task.objects.filter(name=REPORT, args=args, status="SUCCESSFUL").exists()

    wait_until(lambda: ran(["eu"]), 30, "a run of the new schedule")
    schedule = Schedule.objects.get(name="reports")
    admin_client.post(change_url(schedule), form(spec="every 1s", queue="default",
                                                 args='["us"]'))
    wait_until(lambda: ran(["us"]), 30, "a run with the edited arguments")
    admin_client.post(change_url(schedule), form(spec="every 1s", queue="default",
                                                 enabled=None))
    stop_processes(workers)
    runs = [planned_at(task) for task in Task.objects.filter(name=REPORT)]
    assert max(Counter(runs).values()) == 1  # three workers, each planned run once
    assert all(task.result == "us:full" for task in Task.objects.filter(
        name=REPORT, args=["us"], status="SUCCESSFUL"))


def test_every_fields_error_shows_at_once(admin_client: Client) -> None:
    # One error in each field, of each kind: what the form itself refuses (JSON that does
    # not parse, a number that is none) and what the scheduler would refuse.
    response = admin_client.post(ADD, form(
        spec="every hour", task_name="nope.not_a_task", timezone="Mars/Olympus",
        args='["unclosed', kwargs='{"queue": "x"}', queue="nowhere", priority="999"))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"spec", "task_name", "timezone", "args", "kwargs", "queue",
                           "priority"}, errors
    assert errors["args"] == ["Enter a valid JSON."]
    assert errors["kwargs"] == ["Reserved name(s): queue; use the schedule's own fields."]
    assert "'every hour' is not a period" in errors["spec"][0]
    assert "nope.not_a_task" in errors["task_name"][0]
    assert "Unknown time zone 'Mars/Olympus'" in errors["timezone"][0]
    assert "nowhere" in errors["queue"][0]
    assert "Priority must be an integer from" in errors["priority"][0]
    assert not Schedule.objects.exists()


def test_a_scheduler_error_shows_next_to_a_form_error(admin_client: Client) -> None:
    response = admin_client.post(ADD, form(priority="not a number", task_name="nope.nothing"))
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"priority", "task_name"}, errors


def test_the_name_field_says_what_it_is(admin_client: Client) -> None:
    page = " ".join(admin_client.get(ADD).content.decode().split())
    assert '<label class="required" for="id_name">Name of the schedule:</label>' in page
    assert "Names this schedule among all others" in page
