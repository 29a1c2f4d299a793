"""The test settings behind PgBouncer in transaction mode (tests/process/test_pgbouncer.py).

Child processes of those tests run with this module: the task database ``default`` is reached
through the test's own PgBouncer (its port in ``PGTASKS_TEST_PGBOUNCER_PORT``), and ``direct``
is the same database without the pooler, the alias ``LISTEN_DATABASE`` names when
``PGTASKS_TEST_PGBOUNCER_LISTEN`` is set (else the workers poll). Liveness is fast: a worker
silent for ``WORKER_TIMEOUT`` (3 s) is taken for lost.
"""

import os

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES, PGTASKS

PORT_VARIABLE = "PGTASKS_TEST_PGBOUNCER_PORT"
LISTEN_VARIABLE = "PGTASKS_TEST_PGBOUNCER_LISTEN"
SCHEDULE_VARIABLE = "PGTASKS_TEST_PGBOUNCER_SCHEDULE"
DIRECT = "direct"
#: The periodic task of the tests that set PGTASKS_TEST_PGBOUNCER_SCHEDULE.
SCHEDULE = {"pgbouncer-tick": {"task": "tests.testapp.periodic.tick", "schedule": 1}}

DATABASES = {
    **DATABASES,
    DIRECT: {**DATABASES["default"], "TEST": {"MIRROR": "default"}},
    "default": {
        **DATABASES["default"],
        "HOST": "127.0.0.1",
        "PORT": os.environ.get(PORT_VARIABLE, "6432"),
        # What Django asks for behind a pooler in transaction mode.
        "DISABLE_SERVER_SIDE_CURSORS": True,
    },
}
PGTASKS = {
    **PGTASKS,
    "POOLER": "transaction",
    # The safety-net poll: short without LISTEN_DATABASE, long with it (a wake-up within it
    # can only come from a notification).
    "POLL_INTERVAL": 30.0 if os.environ.get(LISTEN_VARIABLE) else 0.1,
    # Heartbeat-only liveness through the pooler: long enough that a loaded machine never
    # starves a live worker of its heartbeats that long.
    "WORKER_TIMEOUT": 6.0,
    "SHUTDOWN_GRACE": 2.0,
}
if os.environ.get(LISTEN_VARIABLE):
    PGTASKS["LISTEN_DATABASE"] = DIRECT
if os.environ.get(SCHEDULE_VARIABLE):
    PGTASKS["SCHEDULE"] = SCHEDULE
