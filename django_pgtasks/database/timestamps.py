"""Times PostgreSQL holds and Python cannot: ``infinity``, ``-infinity``, years before 1 or
after 9999.

A ``timestamptz`` column takes them (written by raw SQL, an import, another program), and
psycopg refuses to load them into a ``datetime``: one such value in a page's rows would fail
the whole page. :func:`tolerant_timestamps` reads them instead as :class:`OutOfRange`, a
string that says what the value is, for the pages that show rows to a person (the admin).
Everything else still gets the error: code that computes with a time must not be handed a
string in its place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from django.db import connections
from psycopg import DataError
from psycopg.adapt import Loader
from psycopg.pq import Format

#: The first time a ``datetime`` cannot hold, as SQL: a window of ends that has no upper
#: bound stops here, and leaves ``'infinity'`` and years after 9999 out.
PYTHON_END_SQL = "'10000-01-01 00:00:00+00'::timestamptz"

#: Loader classes made tolerant, by the loader they extend (Django's, per time zone).
_tolerant: dict[type[Loader], type[Loader]] = {}


class OutOfRange(str):
    """A time of a ``timestamptz`` column that no ``datetime`` can hold, as PostgreSQL
    writes it (``"infinity"``, ``"4000-01-01 00:00:00+00 BC"``), marked as out of range.

    A ``str``, so that Django's admin shows it as it is where it would format a
    ``datetime``; ``text`` is PostgreSQL's text alone.
    """

    text: str

    def __new__(cls, text: str) -> OutOfRange:
        value = super().__new__(cls, f"{text} (out of range)")
        value.text = text
        return value


def _tolerant_loader(base: type[Loader]) -> type[Loader]:
    loader = _tolerant.get(base)
    if loader is None:

        class TolerantLoader(base):  # type: ignore[valid-type,misc]
            def load(self, data: Any) -> Any:
                try:
                    return super().load(data)
                except DataError:  # out of Python's range: too large, too small, infinite
                    return OutOfRange(bytes(data).decode())

        loader = _tolerant.setdefault(base, TolerantLoader)
    return loader


def _register(execute: Callable[..., Any], sql: str, params: Any, many: bool,
              context: dict[str, Any]) -> Any:
    cursor = context["cursor"].cursor  # psycopg's, under Django's wrapper
    adapters = cursor.adapters  # the cursor's own copy: the connection's stays as it is
    oid = adapters.types["timestamptz"].oid
    base = adapters.get_loader(oid, Format.TEXT)
    if base is not None and base not in _tolerant.values():
        adapters.register_loader(oid, _tolerant_loader(base))
    return execute(sql, params, many, context)


@contextmanager
def tolerant_timestamps(aliases: Iterable[str]) -> Iterator[None]:
    """Within the block, queries of the connections ``aliases`` read a ``timestamptz`` that
    Python cannot hold as :class:`OutOfRange` instead of raising ``DataError``.

    Only the cursors of these connections in this thread are affected (Django's connections
    are per thread), and only while the block runs.
    """
    with ExitStack() as stack:
        for alias in dict.fromkeys(aliases):
            stack.enter_context(connections[alias].execute_wrapper(_register))
        yield
