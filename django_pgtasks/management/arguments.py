"""Argument types shared by the management commands: a bad value is an argparse error that
names the option, before anything runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse ``type`` accepting a number of ``kind`` greater than 0."""

    def parse(value: str) -> int | float:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
        if number <= 0:
            raise argparse.ArgumentTypeError(f"must be greater than 0, not {value}")
        return number

    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value" messages
    return parse
