"""The statements that link a task to the tasks it waits for, and read how they ended.

Linking is all the enqueuing side does: every parent is counted as not ended, and the
deferred check at the enqueuing transaction's commit (``pgtasks_member_committing()``,
``sql/workflows.sql``) counts off, under a lock, those that had already ended. The release
after a parent's end is :mod:`django_pgtasks.lifecycle.release`'s; see
:mod:`django_pgtasks.models.dependencies` for the whole mechanism and why it is exact.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connections

from django_pgtasks.exceptions import InvalidTaskError
from django_pgtasks.lifecycle.row_loading import fast_cursor

#: The constraint trigger that settles, at commit, the parents that ended before it.
COMMIT_CHECK = "pgtasks_member_committing"

# The edges (in depends_on order: their ids keep it), then one member row per task of the
# workflow with its count of parents. A task without a workflow id joins the workflow of its
# first parent, if that one belongs to one, else a new one.
LINK_SQL = """
    WITH edges AS (
        INSERT INTO pgtasks_dependency (child_id, parent_id, resolved)
        SELECT e.child, e.parent, false
        FROM unnest(%b::bigint[], %b::bigint[]) WITH ORDINALITY AS e(child, parent, n)
        ORDER BY e.n
    )
    INSERT INTO pgtasks_workflow_member (task_id, workflow_id, remaining, outside_parents,
                                         on_parent_failure, created_at)
    SELECT m.task,
           coalesce(m.workflow, (SELECT w.workflow_id FROM pgtasks_workflow_member w
                                 WHERE w.task_id = m.first_parent), gen_random_uuid()),
           m.remaining, m.outside, m.policy, now()
    FROM unnest(%b::bigint[], %b::uuid[], %b::bigint[], %b::int[], %b::bool[], %b::text[])
         AS m(task, workflow, first_parent, remaining, outside, policy)
    RETURNING task_id, workflow_id
"""

# Which of the given ids are tasks (the parents named by id must exist when linked).
EXISTING_SQL = "SELECT id FROM pgtasks_task WHERE id = ANY (%s)"

#: Parents looked up per statement by :func:`parent_outcomes` and :func:`parent_counts`: few
#: enough that the planner's estimate of a page (a probe of each partition per parent) stays
#: under ``jit_above_cost`` with two months of daily partitions (JIT took 24 of a statement's
#: 29 ms with pages of 1,000).
PARENTS_PAGE = 100

# A task's edges, through the (child_id, parent_id) index, with their ids (depends_on order:
# sorted by the caller, as an ORDER BY id could lead the planner down the primary key of the
# whole table).
EDGES_SQL = "SELECT id, parent_id, parent_status FROM pgtasks_dependency WHERE child_id = %s"
# How the parents of a page ended, each looked up by id: a probe of each partition's primary
# key. The LATERAL subquery with OFFSET 0 cannot be turned into a join, so no statistics can
# lead the planner to a hash join that reads the whole finished history to find a group's
# parents (33,001 rows read for 3,000 parents beside 30,000 finished tasks, and past a 1 s
# statement_timeout on a busy server); a page a statement keeps each one short for a join of
# any size.
PARENTS_SQL = """
    SELECT p.id, t.status, t.name, t.result::text, t.error_text
    FROM unnest(%s::bigint[]) AS p(id)
    JOIN LATERAL (SELECT id, name, status, result, error_text FROM pgtasks_task
                  WHERE id = p.id OFFSET 0) t ON true
"""
# The same, without what the counts of each state do not need (the results are not read).
PARENT_STATES_SQL = """
    SELECT p.id, t.status
    FROM unnest(%s::bigint[]) AS p(id)
    JOIN LATERAL (SELECT id, status FROM pgtasks_task WHERE id = p.id OFFSET 0) t ON true
"""
# Those among the rest that are in the archive (purged since they ended); of those in neither,
# the edge still tells how they ended.
ARCHIVED_PARENTS_SQL = """
    SELECT id, status, name, result::text, error_text FROM pgtasks_task_archive
    WHERE id = ANY (%s)
"""


@dataclass(frozen=True)
class Link:
    """One task of a workflow, saved, and the ids of the tasks it waits for."""

    task_id: int
    parent_ids: Sequence[int]
    on_parent_failure: str
    #: Whether some parents were saved before this transaction: they are checked again at
    #: its commit (a parent of the same transaction cannot end before it).
    outside_parents: bool
    #: ``None``: the workflow of its first parent, else a new one.
    workflow_id: uuid.UUID | None


def parent_refs(tasks: Sequence[Any], parents: Sequence[Sequence[Any]], model: type,
                db: str) -> list[list[tuple[str, int]]]:
    """Each task's parents, without repeats, as ``("local", index)`` (a task of ``tasks``)
    or ``("id", pk)`` (a saved task); raises ``InvalidTaskError`` for an empty workflow, a
    task given twice, a parent that is no task, and tasks waiting for each other in a
    circle."""
    if not tasks:
        raise InvalidTaskError("A workflow needs at least one task.")
    position = {id(task): i for i, task in enumerate(tasks)}
    if len(position) != len(tasks):
        raise InvalidTaskError("A task appears twice in one workflow.")
    links: list[list[tuple[str, int]]] = []
    for task, items in zip(tasks, parents, strict=True):
        seen: dict[tuple[str, int], None] = {}
        for item in items:
            seen[parent_ref(item, position, model, db, task.name)] = None
        links.append(list(seen))
    refuse_cycles(tasks, links)
    return links


def parent_ref(item: Any, position: dict[int, int], model: type, db: str,
                name: str) -> tuple[str, int]:
    """What a parent given to ``TaskManager.enqueue_linked()`` is: a task of the same
    call (``("local", index)``) or the id of a saved task (``("id", pk)``)."""
    if id(item) in position:
        return "local", position[id(item)]
    if isinstance(item, model):
        if item.pk is None:
            raise InvalidTaskError(
                f"Task {name} depends on an unsaved task ({item.name}) that is not part of "
                f"the same workflow; enqueue it first or enqueue both together.")
        if item._state.db and item._state.db != db:
            raise InvalidTaskError(
                f"Task {name} depends on task {item.pk} of database {item._state.db!r}; the "
                f"tasks it depends on must be on its own database ({db!r}).")
        return "id", item.pk
    if isinstance(item, int) and not isinstance(item, bool) and 0 < item < 2**63:
        return "id", item
    raise InvalidTaskError(
        f"depends_on takes tasks or their ids, not {type(item).__name__} {item!r:.50}.")


def refuse_cycles(tasks: Sequence[Any], links: Sequence[Sequence[tuple[str, int]]]) -> None:
    """Raise if the tasks of one call wait for each other in a circle (none would ever run).
    Tasks saved before cannot be part of a circle: they never wait for new ones."""
    waiting_for = [{index for kind, index in refs if kind == "local"} for refs in links]
    done: set[int] = set()
    progress = True
    while progress:
        progress = False
        for i, needs in enumerate(waiting_for):
            if i not in done and needs <= done:
                done.add(i)
                progress = True
    if len(done) < len(tasks):
        stuck = sorted({tasks[i].name for i in range(len(tasks)) if i not in done})
        raise InvalidTaskError(
            f"The tasks of this workflow wait for each other in a circle ({', '.join(stuck)}); "
            f"none of them could ever run.")


def link(using: str, links: Sequence[Link]) -> dict[int, uuid.UUID]:
    """Insert the edges and member rows of ``links`` (one statement); return each task's
    workflow id. Run it in the transaction that inserted the tasks."""
    children: list[int] = []
    parents: list[int] = []
    for item in links:
        for parent in item.parent_ids:
            children.append(item.task_id)
            parents.append(parent)
    columns = [
        children, parents,
        [item.task_id for item in links],
        [item.workflow_id for item in links],
        [item.parent_ids[0] if item.parent_ids else None for item in links],
        [len(item.parent_ids) for item in links],
        [item.outside_parents for item in links],
        [item.on_parent_failure for item in links],
    ]
    with fast_cursor(using) as cursor:
        cursor.execute(LINK_SQL, columns)
        return dict(cursor.fetchall())


def missing(using: str, ids: Sequence[int]) -> list[int]:
    """The ids among ``ids`` that are no task of ``using``."""
    if not ids:
        return []
    with connections[using].cursor() as cursor:
        cursor.execute(EXISTING_SQL, [list(ids)])
        found = {row[0] for row in cursor.fetchall()}
    return sorted(set(ids) - found)


def settle_ended_parents(using: str) -> None:
    """Inside a transaction that will not commit (a test's): run now the commit-time check of
    the tasks linked so far, as the commit would."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"SET CONSTRAINTS {COMMIT_CHECK} IMMEDIATE")
        cursor.execute(f"SET CONSTRAINTS {COMMIT_CHECK} DEFERRED")


@dataclass(frozen=True)
class ParentOutcome:
    """How a task this one depends on ended."""

    id: int
    name: str
    #: ``SUCCESSFUL``, ``FAILED`` or ``CANCELLED`` (``DELETED`` if it was deleted before it
    #: ended or purged without an archive).
    status: str
    #: Its handler's return value (``None`` unless it succeeded).
    result: Any
    error_text: str

    @property
    def succeeded(self) -> bool:
        return self.status == "SUCCESSFUL"


def _parents(using: str, task_id: int, sql: str
             ) -> list[tuple[int, str | None, tuple[Any, ...] | None]]:
    """Each parent of task ``task_id`` in depends_on order, as ``(id, its edge's status,
    its row)``: the row of ``sql`` (:data:`PARENTS_SQL`, or :data:`PARENT_STATES_SQL` for
    the status alone) or, for a parent purged since, of the archive cut to the same columns;
    ``None`` for a parent in neither."""
    rows: dict[int, tuple[Any, ...]] = {}
    with connections[using].cursor() as cursor:
        cursor.execute(EDGES_SQL, [task_id])
        edges = [(pk, status) for _, pk, status in sorted(cursor.fetchall())]
        for start in range(0, len(edges), PARENTS_PAGE):
            cursor.execute(sql, [[pk for pk, _ in edges[start:start + PARENTS_PAGE]]])
            rows.update((row[0], row) for row in cursor.fetchall())
        purged = [pk for pk, _ in edges if pk not in rows]
        if purged:
            width = len(cursor.description)
            cursor.execute(ARCHIVED_PARENTS_SQL, [purged])
            rows.update((row[0], row[:width]) for row in cursor.fetchall())
    return [(pk, status, rows.get(pk)) for pk, status in edges]


def parent_outcomes(using: str, task_id: int) -> list[ParentOutcome]:
    """How each parent of task ``task_id`` ended, in the order they were given."""
    outcomes = []
    for pk, edge_status, row in _parents(using, task_id, PARENTS_SQL):
        if row is None:  # its edge still tells how it ended
            outcomes.append(ParentOutcome(pk, "", edge_status or "DELETED", None, ""))
        else:
            _, status, name, result, error_text = row
            outcomes.append(ParentOutcome(
                pk, name, status, None if result is None else json.loads(result), error_text))
    return outcomes


def parent_counts(using: str, task_id: int) -> dict[str, int]:
    """How many parents of task ``task_id`` ended in each state."""
    return dict(Counter(row[1] if row else edge_status or "DELETED"
                        for _, edge_status, row in _parents(using, task_id,
                                                            PARENT_STATES_SQL)))
