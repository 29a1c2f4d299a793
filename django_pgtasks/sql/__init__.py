"""The database's own code: the current definition of every function and trigger.

One file per concern (``claim.sql``, ``enqueue.sql``, ``history.sql``, ``notify.sql``,
``workflows.sql``); each definition starts with a ``-- name: function <name>`` or
``-- name: trigger <name> on <table>`` line and ends with ``;``. This is where a reader finds
what the database does and why, and where a change starts: a new migration then applies a
frozen copy of the changed definitions (a released migration never changes).
``tests/integration/test_sql.py`` checks that a database migrated to the latest migration has
exactly these definitions, no more and no fewer.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

FOLDER = Path(__file__).resolve().parent

_NAME_RE = re.compile(r"^-- name: (?P<key>(?:function|trigger) [\w ]+?)\s*$", re.MULTILINE)


@cache
def definitions() -> dict[str, str]:
    """``{"function pgtasks_release": "CREATE OR REPLACE FUNCTION ...", "trigger x on t":
    "CREATE TRIGGER ..."}`` for every definition of every file."""
    found: dict[str, str] = {}
    for path in sorted(FOLDER.glob("*.sql")):
        text = path.read_text()
        marks = list(_NAME_RE.finditer(text))
        for mark, following in zip(marks, [*marks[1:], None], strict=True):
            end = following.start() if following is not None else len(text)
            body = text[mark.end():end].strip()
            # Comments between the end of a definition and the next name line belong to
            # the next one: keep the statement up to its final semicolon.
            body = body[:body.rindex(";") + 1]
            if mark["key"] in found:
                raise ValueError(f"{path.name}: {mark['key']} is defined twice.")
            found[mark["key"]] = body
    return found
