"""Development and test helpers: where is the PostgreSQL server to use?

Production projects configure ``DATABASES`` themselves; this module only serves the example
project and the test suite (and projects that want the same convention):

1. ``DATABASE_URL`` (parsed with ``dj-database-url``) if set;
2. otherwise libpq's standard ``PG*`` variables (``PGHOST``, ``PGPORT``, ``PGUSER``, ...),
   with the local server on ``localhost:5432`` as user ``postgres`` as the fallback.
"""

from __future__ import annotations

import os
from typing import Any


def database_config(default_name: str) -> dict[str, Any]:
    """A ``DATABASES`` entry for the development/test database."""
    url = os.environ.get("DATABASE_URL")
    if url:
        import dj_database_url

        config = dj_database_url.parse(url)
    else:
        config = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("PGDATABASE", default_name),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            "HOST": os.environ.get("PGHOST", "localhost"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
    config.setdefault("CONN_MAX_AGE", 0)
    return config
