"""Time the admin's dashboard and task list on a large task table.

Usage (from the project root)::

    .venv/bin/python bench/admin_render.py [--finished 1000000] [--waiting 100000]
        [--repeat 5] [--database-name pgtasks_admin_bench] [--keep]

The script creates a scratch database on the server that ``DATABASES["default"]`` of the test
settings points at (``tests.settings``: ``DATABASE_URL``, the ``PG*`` variables, or
localhost:5432), migrates it and seeds it with ``INSERT … SELECT generate_series``:

- ``--finished`` tasks that ended over the last 7 days (the default retention): 90 %
  successful, 8 % failed with one of five error messages that carry ids and numbers (so they
  group), 2 % cancelled; twenty task names, four queues; ids grow with ``created_at``;
- ``--waiting`` tasks waiting (ready, or awaiting a retry), some of them scheduled later;
- 200 running tasks, a few of them with an expired lease (stuck), and two workers.

It then runs ``VACUUM (ANALYZE)`` (the state autovacuum keeps a busy table in), logs a
superuser in with Django's test client, and renders each page once to warm up and
``--repeat`` times more, printing the median and the slowest time, the median time spent in
SQL (round trips included), the number of SQL queries, and the slowest query of the page.
Nothing is asserted: the numbers go in ``docs/admin.md``. The scratch database is dropped at
the end unless ``--keep`` is given.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

NAMES = [f"shop.tasks.job_{n:02d}" for n in range(20)]

# Finished tasks over the last 7 days, oldest first (ids grow with created_at).
SEED_FINISHED = """
INSERT INTO pgtasks_task (
    name, queue, args, kwargs, priority, status, attempt, max_attempts, run_after,
    locked_by, started_at, finished_at, error_text, metadata, created_at, updated_at
)
SELECT (%(names)s::text[])[1 + i %% 20],
       (ARRAY['default', 'emails', 'urgent', 'reports'])[1 + i %% 4],
       json_build_array(i, 'order-' || i)::jsonb, '{"notify": true}', 100,
       CASE WHEN i %% 50 = 7 THEN 'CANCELLED'
            WHEN i %% 25 IN (3, 11) THEN 'FAILED' ELSE 'SUCCESSFUL' END,
       CASE WHEN i %% 25 IN (3, 11) THEN 3 ELSE 1 END, 3,
       t.created, 'bench-host:' || (i %% 8) || ':worker', t.created + interval '1 second',
       t.created + interval '1 second' + (i %% 30) * interval '100 milliseconds',
       CASE WHEN i %% 25 IN (3, 11) THEN
           (ARRAY['LookupError: order ' || i || ' not found',
                  'ConnectionError: upstream 10.0.' || (i %% 7) || '.' || (i %% 250)
                      || ':5432 refused the connection',
                  'TimeoutError: request ' || md5(i::text) || ' took more than 30 s',
                  'ValueError: invalid literal for int() with base 10: ''x' || i || '''',
                  'SMTPServerDisconnected: Connection unexpectedly closed'])[1 + i %% 5]
           || E'\n\nTraceback (most recent call last):\n'
           || repeat(E'  File "/srv/shop/tasks.py", line 118, in run\n    do_it()\n', 6)
       ELSE '' END,
       '{}', t.created, t.created + interval '4 seconds'
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT now() - interval '7 days' * (1 - i::float8 / %(rows)s)) AS t(created)
"""

# Waiting tasks, created over the last hour: most due, every 10th scheduled an hour ahead,
# every 7th awaiting a retry.
SEED_WAITING = """
INSERT INTO pgtasks_task (
    name, queue, args, kwargs, priority, status, attempt, max_attempts, run_after,
    error_text, metadata, created_at, updated_at
)
SELECT (%(names)s::text[])[1 + i %% 20],
       (ARRAY['default', 'emails'])[1 + i %% 2],
       json_build_array(i)::jsonb, '{}', (ARRAY[50, 100, 100, 100, 150])[1 + i %% 5],
       CASE WHEN i %% 7 = 0 THEN 'AWAITING_RETRY' ELSE 'READY' END,
       CASE WHEN i %% 7 = 0 THEN 1 ELSE 0 END, 3,
       CASE WHEN i %% 10 = 0 THEN now() + interval '1 hour'
            ELSE now() - interval '1 hour' * (1 - i::float8 / %(rows)s) END,
       CASE WHEN i %% 7 = 0 THEN 'TimeoutError: upstream timed out' ELSE '' END,
       '{}', now() - interval '1 hour' * (1 - i::float8 / %(rows)s), now()
FROM generate_series(1, %(rows)s) AS i
"""

SEED_RUNNING = """
INSERT INTO pgtasks_task (
    name, queue, args, kwargs, priority, status, attempt, max_attempts, run_after,
    locked_by, locked_at, started_at, error_text, metadata, created_at, updated_at
)
SELECT (%(names)s::text[])[1 + i %% 20], 'default', '[]', '{}', 100, 'RUNNING', 1, 3, now(),
       CASE WHEN i %% 40 = 0 THEN 'gone-host:1:worker' ELSE 'bench-host:' || (i %% 2)
           || ':worker' END,
       now() - (CASE WHEN i %% 40 = 0 THEN interval '10 minutes' ELSE interval '2 seconds' END),
       now(), '', '{}', now(), now()
FROM generate_series(1, 200) AS i
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=1_000_000,
                        help="Finished tasks to seed (default: 1000000).")
    parser.add_argument("--waiting", type=int, default=100_000,
                        help="Waiting tasks to seed (default: 100000).")
    parser.add_argument("--repeat", type=int, default=5,
                        help="Timed renders of each page after one warm-up (default: 5).")
    parser.add_argument("--database-name", default="pgtasks_admin_bench",
                        help="Scratch database to create and drop "
                             "(default: pgtasks_admin_bench).")
    parser.add_argument("--queries", action="store_true",
                        help="Also print every SQL query of each page with its time "
                             "(default: the slowest one only).")
    parser.add_argument("--only", default="",
                        help="Time only the pages whose title contains this text "
                             "(default: all).")
    parser.add_argument("--keep", action="store_true",
                        help="Keep the scratch database at the end (default: drop it).")
    return parser.parse_args()


def admin_connection(db_settings: dict):
    import psycopg

    return psycopg.connect(
        dbname="postgres", host=db_settings.get("HOST") or None,
        port=db_settings.get("PORT") or None, user=db_settings.get("USER") or None,
        password=db_settings.get("PASSWORD") or None, autocommit=True,
    )


def seed(finished: int, waiting: int) -> None:
    from django.db import connection

    from django_pgtasks.models import WorkerProcess

    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(SEED_FINISHED, {"names": NAMES, "rows": finished})
        cursor.execute(SEED_WAITING, {"names": NAMES, "rows": waiting})
        cursor.execute(SEED_RUNNING, {"names": NAMES})
    for n in range(2):
        WorkerProcess.objects.create(name=f"bench-host:{n}:worker", hostname="bench-host",
                                     pid=1000 + n, concurrency=100, queues=["default"])
    seeded = time.perf_counter() - started
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) pgtasks_task")
        cursor.execute("SELECT status, count(*) FROM pgtasks_task GROUP BY 1 ORDER BY 1")
        counts = cursor.fetchall()
        cursor.execute("SELECT pg_size_pretty(pg_total_relation_size('pgtasks_task'))")
        (size,) = cursor.fetchone()
    print(f"Seeded in {seeded:.1f}s, VACUUM (ANALYZE) in {time.perf_counter() - started:.1f}s;"
          f" table with indexes: {size}")
    print("Rows: " + ", ".join(f"{status} {n:,}" for status, n in counts))


def pages() -> list[tuple[str, str]]:
    from django.urls import reverse

    from django_pgtasks.models import Task
    from django_pgtasks.monitoring.dashboard import database_snapshot

    changelist = reverse("admin:django_pgtasks_task_changelist")
    dashboard = reverse("admin:django_pgtasks_task_dashboard")
    snapshot = database_snapshot()
    group = snapshot.error_groups[0]
    window = {"status__exact": "FAILED", "error_group": group.text,
              "finished_at__gte": snapshot.since.isoformat()}
    task = Task.objects.failed().order_by("-id").first()
    return [
        ("dashboard, last 24 h", dashboard),
        ("dashboard, last 3 days", f"{dashboard}?hours=72"),
        ("task list, no filter", changelist),
        ("task list, status = Failed", f"{changelist}?status__exact=FAILED"),
        ("task list, one task name (attempts first)", f"{changelist}?name={NAMES[3]}"),
        ("task list, error group from the dashboard", f"{changelist}?{urlencode(window)}"),
        ("task list, error group, all time",
         f"{changelist}?{urlencode({k: window[k] for k in ('status__exact', 'error_group')})}"),
        ("task list, waiting in queue default",
         f"{changelist}?status__exact=READY&queue=default"),
        ("task list, search by id", f"{changelist}?q={task.pk}"),
        ("task page", reverse("admin:django_pgtasks_task_change", args=[task.pk])),
        ("requeue error group: confirmation, last 24 h",
         f"{reverse('admin:django_pgtasks_task_requeue_group')}?"
         f"{urlencode({'group': group.text, 'since': snapshot.since.isoformat()})}"),
        ("requeue error group: confirmation, all time",
         f"{reverse('admin:django_pgtasks_task_requeue_group')}?"
         f"{urlencode({'group': group.text})}"),
    ]


def time_pages(repeat: int, show_queries: bool = False, only: str = "") -> None:
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_superuser("bench", "bench@example.com", "x"))
    print(f"\n{'page':<46} {'median':>8} {'slowest':>8} {'SQL':>8} {'queries':>8}  "
          f"slowest query")
    for title, url in pages():
        if only not in title:
            continue
        timings, sql_times, captured = time_page(client, title, url, repeat)
        slowest = max(captured.captured_queries, key=lambda q: float(q["time"]))
        sql = " ".join(slowest["sql"].split())
        print(f"{title:<46} {statistics.median(timings) * 1000:>6.0f}ms "
              f"{max(timings) * 1000:>6.0f}ms {statistics.median(sql_times) * 1000:>6.0f}ms "
              f"{len(captured.captured_queries):>8}  "
              f"{float(slowest['time']) * 1000:.0f}ms {sql[:70]}")
        if show_queries:
            for query in captured.captured_queries:
                print(f"    {float(query['time']) * 1000:6.1f}ms  "
                      f"{' '.join(query['sql'].split())[:150]}")


def time_page(client, title: str, url: str, repeat: int) -> tuple[list[float], list[float], Any]:
    """Render ``url`` once to warm up, then ``repeat`` times: the render times, the SQL time
    of each, and the queries of the last render (a CaptureQueriesContext)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)  # warm-up
    assert response.status_code == 200, (title, response.status_code)
    timings, sql_times = [], []
    for _ in range(repeat):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url)
            timings.append(time.perf_counter() - started)
        assert response.status_code == 200, (title, response.status_code)
        sql_times.append(sum(float(q["time"]) for q in captured.captured_queries))
    return timings, sql_times, captured


def main() -> int:
    args = parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.conf import settings

    db_settings = settings.DATABASES["default"]
    with admin_connection(db_settings) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{args.database_name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{args.database_name}"')
    db_settings["NAME"] = args.database_name
    try:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection, connections
        from django.test.utils import setup_test_environment

        setup_test_environment()  # the test client's host name is allowed
        settings.DEBUG = True  # query timings for the report (pages render the same)
        call_command("migrate", verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            (version,) = cursor.fetchone()
        print(f"Server: {version}")
        print(f"Client: {platform.node()} with {os.cpu_count()} CPU(s), Python "
              f"{platform.python_version()}, Django {django.get_version()}")
        print("Load average before seeding (1, 5, 15 min): "
              + " ".join(f"{x:.1f}" for x in os.getloadavg()))
        print(f"Seeding {args.finished:,} finished and {args.waiting:,} waiting tasks into "
              f"{args.database_name}")
        seed(args.finished, args.waiting)
        time_pages(args.repeat, args.queries, args.only)
        print("Load average after timing (1, 5, 15 min): "
              + " ".join(f"{x:.1f}" for x in os.getloadavg()))
        connections.close_all()
    finally:
        if not args.keep:
            with admin_connection(db_settings) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{args.database_name}" WITH (FORCE)')
            print(f"\nDropped {args.database_name}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
