"""The choice of execution pool and its limits, checked at the boundary: the command line,
the settings' check and the Worker's constructor refuse what no pool can do."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_pgtasks.checks import check_settings
from django_pgtasks.worker.pools import POOL_KINDS, PoolOptions, check_options


@pytest.mark.parametrize("kind", POOL_KINDS)
def test_every_pool_kind_is_accepted(kind: str) -> None:
    assert check_options(PoolOptions(kind=kind)) is None


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (PoolOptions(kind="gevent"), "unknown pool 'gevent'"),
        (PoolOptions(kind="thread", max_tasks_per_child=5), "process pool only"),
        (PoolOptions(kind="async", max_memory_per_child=512), "process pool only"),
        (PoolOptions(kind="process", max_tasks_per_child=0), "at least 1"),
        (PoolOptions(kind="process", max_memory_per_child=True), "at least 1"),
        (PoolOptions(kind="process", max_memory_per_child=1.5), "at least 1"),
    ],
)
def test_what_no_pool_can_do_is_refused_in_words(options: PoolOptions, says: str) -> None:
    problem = check_options(options)
    assert problem is not None
    assert says in problem


def test_process_limits_are_accepted_with_the_process_pool() -> None:
    options = PoolOptions(kind="process", max_tasks_per_child=100, max_memory_per_child=512)
    assert check_options(options) is None


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--pool", "thread", "--max-tasks-per-child", "3"], "process pool only"),
        (["--max-memory-per-child", "100"], "process pool only"),
    ],
)
def test_the_command_refuses_limits_its_pool_cannot_keep(argv: list[str], says: str) -> None:
    with pytest.raises(CommandError, match=says):
        call_command("run_pgtasks", *argv)


@pytest.mark.parametrize("argv", [["--pool", "fibers"], ["--pool", "process",
                                                         "--max-tasks-per-child", "0"]])
def test_the_command_refuses_a_bad_value_before_anything_runs(argv: list[str]) -> None:
    with pytest.raises(CommandError):
        call_command("run_pgtasks", *argv)


@pytest.mark.parametrize(
    "pgtasks",
    [{"POOL": "fibers"}, {"MAX_TASKS_PER_CHILD": 10}, {"POOL": "process",
                                                       "MAX_MEMORY_PER_CHILD": -1}],
)
def test_the_settings_check_reports_e025(pgtasks: dict[str, object]) -> None:
    with override_settings(PGTASKS=pgtasks):
        ids = [error.id for error in check_settings()]
    assert "django_pgtasks.E025" in ids


def test_the_settings_check_accepts_a_process_pool_with_limits() -> None:
    pgtasks = {"POOL": "process", "MAX_TASKS_PER_CHILD": 10, "MAX_MEMORY_PER_CHILD": 256}
    with override_settings(PGTASKS=pgtasks):
        ids = [error.id for error in check_settings()]
    assert "django_pgtasks.E025" not in ids


def test_the_worker_refuses_a_limit_its_pool_cannot_keep() -> None:
    from django_pgtasks.worker import Worker

    with pytest.raises(ValueError, match="process pool only"):
        Worker(pool="thread", max_tasks_per_child=2)


@pytest.mark.parametrize("grace", [-1, True, "10", float("inf"), float("nan")])
def test_a_cancel_grace_that_is_no_number_of_seconds_is_refused(grace: object) -> None:
    problem = check_options(PoolOptions(kind="process", cancel_grace=grace))
    assert problem == ("cancel_grace must be None or a number of seconds of at least 0, "
                       f"not {grace!r}")


@pytest.mark.parametrize("grace", [None, 0, 2.5])
def test_a_cancel_grace_is_none_or_seconds(grace: float | None) -> None:
    assert check_options(PoolOptions(kind="process", cancel_grace=grace)) is None


@pytest.mark.parametrize(("grace", "refused"), [(-5, True), ("soon", True), (None, False),
                                                (30, False)])
def test_the_settings_check_reports_a_bad_cancel_grace(grace: object, refused: bool) -> None:
    with override_settings(PGTASKS={"CANCEL_GRACE": grace}):
        ids = [error.id for error in check_settings()]
    assert ("django_pgtasks.E025" in ids) is refused


def test_the_command_hands_its_cancel_grace_to_the_process_pool_worker() -> None:
    from django_pgtasks.management.commands.run_pgtasks import Command

    command = Command()
    options = vars(command.create_parser("manage.py", "run_pgtasks").parse_args(
        ["--pool", "process", "--cancel-grace", "2.5"]))
    assert command._worker_options(options)["cancel_grace"] == 2.5
    options = vars(command.create_parser("manage.py", "run_pgtasks").parse_args([]))
    assert command._worker_options(options)["cancel_grace"] is None  # the setting's


def test_the_worker_takes_its_cancel_grace_from_the_setting_unless_given() -> None:
    from django_pgtasks.worker import Worker

    with override_settings(PGTASKS={"CANCEL_GRACE": None}):
        assert Worker().pool_options.cancel_grace is None
        assert Worker(cancel_grace=3).pool_options.cancel_grace == 3
    assert Worker().pool_options.cancel_grace == 10.0
