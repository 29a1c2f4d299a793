"""Failures grouped by error: the first line of ``error_text`` with its numbers blanked out.

The admin's error-group filter, the dashboard and the requeue of a group share this one
expression, so a group means the same rows everywhere.
"""

from __future__ import annotations

from django.db.models import F, Func, TextField, Value
from django.db.models.functions import Left

#: Characters of a normalized first error line that name its group. Bounds the links the
#: dashboard builds and the values the error-group filter accepts.
ERROR_GROUP_LENGTH = 200

#: What :func:`error_group_expression` blanks out: hexadecimal words with a digit, then
#: runs of digits (PostgreSQL regular expressions).
HEX_WORD_PATTERN = r"\m(0x)?[0-9a-fA-F]*[0-9][0-9a-fA-F]*\M"
DIGITS_PATTERN = "[0-9]+"
#: :func:`error_group_expression` as SQL text, for raw statements; it takes the patterns as
#: the parameters ``%(hex)s`` and ``%(digits)s``.
ERROR_GROUP_SQL = (
    "left(regexp_replace(regexp_replace(split_part(error_text, E'\\n', 1), %(hex)s, 'N', "
    f"'g'), %(digits)s, 'N', 'g'), {ERROR_GROUP_LENGTH})"
)


def error_group_expression() -> Func:
    """SQL naming a failure's group: the first line of ``error_text`` with ids blanked out.

    Hexadecimal words that contain a digit (UUIDs, hashes, ``0x`` addresses), then any other
    run of digits, become ``N``: "Order 41 not found" and "Order 97 not found" are one
    problem. The dashboard groups by this expression and the changelist's error-group filter
    compares with it, so a group's link always finds exactly the tasks that were counted.
    """
    first_line = Func(
        F("error_text"), Value("\n"), Value(1), function="split_part", output_field=TextField()
    )
    without_hex = _regexp_replace(first_line, HEX_WORD_PATTERN)
    return Left(_regexp_replace(without_hex, DIGITS_PATTERN), ERROR_GROUP_LENGTH)


def _regexp_replace(expression: Func, pattern: str) -> Func:
    return Func(
        expression, Value(pattern), Value("N"), Value("g"),
        function="regexp_replace", output_field=TextField(),
    )
