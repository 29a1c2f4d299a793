"""The schedules a process declares (``scheduling/declarations.py``), their system checks,
and the checks of a schedule made in the admin (``scheduling/runtime.py``), before anything
is written. Producing the runs, exactly once, is tested in
``tests/integration/test_scheduling.py``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from django_pgtasks import pgtask
from django_pgtasks.checks import check_schedules
from django_pgtasks.definition.recurrence import Every, cron, every
from django_pgtasks.models import Schedule, Task
from django_pgtasks.scheduling import planned_at
from django_pgtasks.scheduling.declarations import Declaration, collect, declared_names
from django_pgtasks.scheduling.runtime import declaration_of, problems, validate
from tests.testapp import periodic

# Registered now, not by a test whose handlers are unregistered after it.
TICK = periodic.tick.name
REPORT = periodic.report.name



def check_ids() -> list[str]:
    return [error.id.removeprefix("django_pgtasks.") for error in check_schedules()]


# -- declarations in code and in settings -----------------------------------------------------


def test_a_handler_with_a_schedule_is_declared_under_its_name(
    temporary_handlers: None, settings: Any,
) -> None:
    settings.TIME_ZONE = "Europe/Paris"
    pgtask(name="tests.unit.nightly", schedule=cron("0 3 * * *"))(lambda: None)
    pgtask(name="tests.unit.tokyo", schedule=cron("0 9 * * *", timezone="Asia/Tokyo"))(
        lambda: None)
    declarations, found = collect()
    assert found == []
    nightly = declarations["tests.unit.nightly"]
    assert (nightly.task, nightly.spec, nightly.timezone) == (
        "tests.unit.nightly", "0 3 * * *", "Europe/Paris")  # the TIME_ZONE setting
    assert declarations["tests.unit.tokyo"].timezone == "Asia/Tokyo"  # its own
    assert {"tests.unit.nightly", "tests.unit.tokyo"} <= declared_names()


def test_a_settings_entry_is_declared_with_its_options(pgtasks) -> None:
    pgtasks(SCHEDULE={"reports": {"task": REPORT, "schedule": every(minutes=90), "args": ["eu"],
                                  "kwargs": {"full": True}, "queue": "emails",
                                  "timezone": "America/New_York", "enabled": False}})
    declarations, found = collect()
    assert found == []
    assert declarations["reports"] == Declaration(
        name="reports", task=REPORT, when=every(minutes=90),
        timezone="America/New_York", args=("eu",), kwargs={"full": True}, queue="emails",
        enabled=False)
    assert declarations["reports"].row == (REPORT, "every 1h30m", "America/New_York", False)


def test_a_schedule_name_declared_twice_is_reported(temporary_handlers: None, pgtasks) -> None:
    pgtask(name="tests.twice", schedule=60)(lambda: None)
    pgtasks(SCHEDULE={"tests.twice": {"task": TICK, "schedule": 30}})
    assert check_ids() == ["E030"]
    assert "declared twice" in check_schedules()[0].msg


def test_valid_schedules_pass_the_checks(pgtasks) -> None:
    pgtasks(SCHEDULE={"tick": {"task": TICK, "schedule": "*/5 * * * *",
                               "timezone": "Europe/Berlin", "queue": "emails"}},
            MISSED_RUNS="skip")
    assert check_schedules() == []


@pytest.mark.parametrize(("options", "expected"), [
    ({"SCHEDULE": {"x": {"task": "nowhere.missing", "schedule": 60}}}, ["E031"]),
    # A module of an installed app that does not exist: HandlerImportError, not a crash.
    ({"SCHEDULE": {"x": {"task": "tests.testapp.nosuchmodule.f", "schedule": 60}}}, ["E031"]),
    ({"SCHEDULE": {"x": {"task": TICK, "schedule": "0 25 * * *"}}}, ["E032"]),
    ({"SCHEDULE": {"x": {"task": TICK, "schedule": -1}}}, ["E032"]),
    ({"SCHEDULE": {"x": {"task": TICK, "schedule": 60, "timezone": "Nowhere/Else"}}},
     ["E032"]),
    ({"SCHEDULE": {"x": {"task": TICK}}}, ["E032"]),
    ({"SCHEDULE": {"x": {"task": TICK, "schedule": 60, "every": 5}}}, ["E030"]),
    ({"SCHEDULE": {"x": {"task": TICK, "schedule": 60, "kwargs": {"queue": "a"}}}},
     ["E030"]),
    ({"SCHEDULE": ["x"]}, ["E030"]),
    ({"SCHEDULE": {"x": {"task": TICK, "schedule": 60, "queue": "nope"}}}, ["E034"]),
    ({"SCHEDULE": {"x": {"task": TICK, "schedule": 0.5}}}, ["W030"]),
    ({"MISSED_RUNS": "twice"}, ["E033"]),
    ({"SCHEDULER_INTERVAL": -1}, ["E010"]),
    ({"SCHEDULER_INTERVAL": float("inf")}, ["E010"]),
])
def test_invalid_schedule_settings_are_reported(pgtasks, options: dict, expected: list) -> None:
    pgtasks(**options)
    assert check_ids() == expected


@pytest.mark.parametrize(("entry", "words"), [
    ({"task": "", "schedule": 60}, "['task'] must be the name of a task handler."),
    ({"task": TICK, "schedule": 60, "args": "a"}, "'args' must be a list and 'kwargs' a dict."),
    ({"task": TICK, "schedule": 60, "kwargs": {"delay": 1, "priority": 2}},
     "['kwargs'] uses reserved name(s): delay, priority."),
    ({"task": TICK, "schedule": 60, "queue": 5}, "['queue'] must be a queue name."),
    ({"task": TICK, "schedule": 60, "enabled": "yes"}, "['enabled'] must be True or False."),
    ({"task": TICK, "schedule": 60, "every": 5, "at": 1}, "has unknown key(s): at, every."),
    ("every minute", "must be a dict with at least 'task' and 'schedule'."),
])
def test_a_bad_entry_is_left_out_and_said_what_is_wrong(
    pgtasks, entry: Any, words: str,
) -> None:
    pgtasks(SCHEDULE={"x": entry})
    declarations, found = collect()
    assert "x" not in declarations
    [problem] = found
    assert problem.message.startswith("PGTASKS['SCHEDULE']['x']")
    assert words in problem.message


@pytest.mark.parametrize("name", ["", "n" * 256, 5])
def test_a_schedule_name_must_fit_its_column(pgtasks, name: Any) -> None:
    pgtasks(SCHEDULE={name: {"task": TICK, "schedule": 60}})
    [problem] = collect()[1]
    assert problem.id == "E030"
    assert "must be a string of 1 to 255 characters" in problem.message


def test_a_period_shorter_than_the_scheduler_interval_is_only_a_warning(pgtasks) -> None:
    pgtasks(SCHEDULE={"x": {"task": TICK, "schedule": 0.5}}, SCHEDULER_INTERVAL=1.0)
    [warning] = check_schedules()
    assert warning.id == "django_pgtasks.W030"
    assert "runs every 0.5s, more often than the scheduler looks" in warning.msg
    pgtasks(SCHEDULE={"x": {"task": TICK, "schedule": 0.5}}, SCHEDULER_INTERVAL=0)
    assert check_schedules() == []  # the scheduler is off: nothing to be late for


# -- the run a declaration builds ------------------------------------------------------------


def test_a_run_is_an_unsaved_validated_task_that_knows_its_planned_time() -> None:
    declaration = Declaration(name="reports", task=REPORT, when=every(hours=1),
                              timezone="UTC", args=("eu",), kwargs={"full": True},
                              queue="emails", priority=150)
    planned = datetime(2026, 1, 5, 13, 0, tzinfo=UTC).astimezone(declaration.tz)
    task = declaration.build(planned)
    assert task.pk is None
    assert (task.name, task.args, task.kwargs, task.queue, task.priority) == (
        REPORT, ["eu"], {"full": True}, "emails", 150)
    assert task.metadata == {"schedule": "reports", "planned_at": "2026-01-05T13:00:00+00:00"}
    assert planned_at(task) == datetime(2026, 1, 5, 13, 0, tzinfo=UTC)


@pytest.mark.parametrize("metadata", [{}, {"planned_at": 5}, [], None, {"schedule": "x"}])
def test_a_task_no_schedule_made_has_no_planned_time(metadata: Any) -> None:
    assert planned_at(Task(name="x", metadata=metadata)) is None


# -- schedules made in the admin ----------------------------------------------------------


def schedule(**fields: Any) -> Schedule:
    values = {"name": "reports", "task_name": REPORT, "spec": "every 1h", "timezone": "UTC",
              "enabled": True, "args": ["eu"], "kwargs": {"full": True}, "queue": "emails",
              "priority": 150}
    values.update(fields)
    return Schedule(**values)


def test_a_row_made_in_the_admin_is_read_as_a_declaration() -> None:
    declaration = declaration_of("reports", REPORT, "every 1h", "UTC", '["eu"]',
                                 '{"full": true}', "", None)
    assert declaration == Declaration(name="reports", task=REPORT,
                                      when=Every(timedelta(hours=1)), timezone="UTC",
                                      args=("eu",), kwargs={"full": True}, queue=None)


def test_a_good_admin_schedule_has_no_problem_and_validates() -> None:
    assert problems(schedule()) == {}
    assert validate(schedule()).when == every(hours=1)


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"name": ""}, "name", "A schedule's name has 1 to 255 characters."),
    ({"spec": "every day"}, "spec", "is not a period"),
    ({"spec": "61 * * * *"}, "spec", "Bad minute"),
    ({"spec": "every 99999999d"}, "spec", "plans its next run after the year 9999"),
    ({"timezone": "Mars/Olympus"}, "timezone", "Unknown time zone 'Mars/Olympus'."),
    ({"args": {"a": 1}}, "args", "The positional arguments are a JSON array."),
    ({"args": ["a\x00"]}, "args", "contains a NUL character"),
    ({"kwargs": ["x"]}, "kwargs", "The keyword arguments are a JSON object."),
    ({"kwargs": {"queue": "emails"}}, "kwargs", "Reserved name(s): queue"),
    ({"task_name": "nowhere.missing"}, "task_name", "No task handler is registered"),
    ({"queue": "nope"}, "queue", "Queue 'nope' is not configured"),
    ({"priority": 500}, "priority", "Priority must be an integer from 0 to 200"),
])
def test_each_fields_problem_is_named_on_its_field(fields: dict, field: str, words: str) -> None:
    found = problems(schedule(**fields))
    assert list(found) == [field]
    assert words in found[field][0]
    with pytest.raises(ValidationError) as excinfo:
        validate(schedule(**fields))
    assert field in excinfo.value.message_dict


def test_every_fields_problem_is_found_at_once_and_skipped_fields_are_not_checked() -> None:
    bad = schedule(spec="nope", timezone="Nowhere", queue="nope", priority=-1)
    assert set(problems(bad)) == {"spec", "timezone", "queue", "priority"}
    assert set(problems(bad, skip=("spec", "queue"))) == {"timezone", "priority"}


def test_a_name_declared_in_code_is_refused(pgtasks) -> None:
    pgtasks(SCHEDULE={"reports": {"task": TICK, "schedule": 60}})
    assert problems(schedule()) == {"name": [
        "A schedule named 'reports' is declared in code; choose another name."]}


def test_arguments_that_do_not_fit_the_task_are_refused_for_the_whole_run() -> None:
    with pytest.raises(ValidationError) as excinfo:
        validate(schedule(kwargs={"fulll": True}))
    assert "got an unexpected keyword argument 'fulll' (did you mean 'full'?)" in str(
        excinfo.value)


def test_an_admin_schedule_must_stay_on_the_task_database(pgtasks) -> None:
    pgtasks(QUEUES={"default": {}, "emails": {"database": "queue_a"}})
    with pytest.raises(ValidationError) as excinfo:
        validate(schedule())
    assert excinfo.value.message_dict == {"queue": [
        "The queue 'emails' is on database 'queue_a'; schedules made in the admin live in "
        "'default' with their runs."]}
