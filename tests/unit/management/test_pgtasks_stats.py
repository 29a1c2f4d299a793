"""``pgtasks_stats``: its options, refused with a clear error before any query. What it
prints from a real database is tested in ``tests/integration/test_stats.py``."""

from __future__ import annotations

import re

import pytest
from django.core.management import CommandError, call_command

from django_pgtasks.management.commands.pgtasks_stats import Command as StatsCommand


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--watch", "0"], "must be greater than 0, not 0"),
        (["--watch", "often"], "'often' is not a number"),
        (["--hours", "0"], "must be greater than 0, not 0"),
        (["--hours", "1.5"], "'1.5' is not a number"),
        (["--hours", "745"], "--hours must be at most 744."),
        (["--database", "nowhere"], "--database 'nowhere' is not an alias in DATABASES."),
    ],
)
def test_command_option_errors_are_clear(args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("pgtasks_stats", *args)


def test_every_command_option_says_its_default() -> None:
    parser = StatsCommand().create_parser("manage.py", "pgtasks_stats")
    own = [a for a in parser._actions
           if {"--hours", "--json", "--watch", "--database"} & set(a.option_strings)]
    assert len(own) == 4
    for action in own:
        assert "(default: " in action.help, action.option_strings
