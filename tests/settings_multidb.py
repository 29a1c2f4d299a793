"""The test settings with queues spread over two PostgreSQL servers (tests/process/test_multidb.py).

``reports`` and ``exports`` live on the database alias ``second`` (tests/second_server.py);
every other queue stays on ``default``. Child processes of the multi-database tests run with
this module; the tests themselves apply :data:`MULTIDB_QUEUES` with ``settings``.
"""

from tests.settings import *  # noqa: F403
from tests.settings import PGTASKS

SECOND = "second"
MULTIDB_QUEUES = {
    "default": {},
    "emails": {},
    "urgent": {},
    "reports": {"database": SECOND},
    "exports": {"database": SECOND},
}
PGTASKS = {**PGTASKS, "QUEUES": MULTIDB_QUEUES}
