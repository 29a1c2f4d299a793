"""The benchmark's django-pgtasks settings with a second database (bench/multidb.py).

``default`` is the scratch database of the usual server (``PG*`` variables); ``second`` is a
scratch database on another PostgreSQL server, given as a libpq URL in ``BENCH_SECOND_URL``.
The queue ``default`` lives on ``default`` and the queue ``far`` on ``second``; every other
setting is at its default.
"""

import os
from urllib.parse import parse_qs, unquote, urlsplit

from bench.pgtasks_site.settings import *  # noqa: F403


def _from_url(url: str) -> dict:
    parts = urlsplit(url)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or "") or "postgres",
        "PASSWORD": unquote(parts.password or ""),
        "HOST": query.get("host") or parts.hostname or "",
        "PORT": str(parts.port or ""),
        "CONN_MAX_AGE": 0,
    }


DATABASES = {**DATABASES, "second": _from_url(os.environ["BENCH_SECOND_URL"])}  # noqa: F405
PGTASKS = {"QUEUES": {"default": {}, "far": {"database": "second"}}}
