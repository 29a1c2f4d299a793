"""Workflows: chains, groups with a callback, and any graph of tasks that wait for others.

::

    from django_pgtasks.workflows import chain, group

    # a -> b -> c: each step runs after the previous one succeeded
    chain(fetch.build(url), parse.build(), store.build()).enqueue()

    # the members run in parallel; the callback runs once, when every member has ended
    group([resize.build(pk) for pk in ids], then=notify.build(batch_id)).enqueue()

    # nested: a, then b and c in parallel, then d
    chain(a.build(), group([b.build(), c.build()]), d.build()).enqueue()

A step is an unsaved task (``handler.build(...)`` or ``Task.objects.build(...)``) or another
chain or group. :meth:`Flow.enqueue` inserts the whole workflow in one transaction (inside
the caller's, like any enqueue): all of it or nothing. A handler reads how the tasks it waited
for ended with ``context.parents()`` (or ``context.parent_result()`` in a chain). A waiting
task is released by the workers' releaser shortly after its last parent ended
(:mod:`django_pgtasks.lifecycle.release`); ``Task.objects.enqueue(..., depends_on=[...])``
makes one task wait for others without a chain or a group.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_pgtasks.exceptions import InvalidTaskError
from django_pgtasks.lifecycle.dependencies import ParentOutcome

__all__ = ["Flow", "ParentOutcome", "Workflow", "cancel", "chain", "group", "members"]

#: What a step of a chain does when the previous one did not succeed (and what a callback of
#: a group does when a member did not succeed).
CHAIN_POLICY = "skip"
CALLBACK_POLICY = "run"


@dataclass
class _Graph:
    """Tasks, each task's parents (tasks of the graph), and each task's policy."""

    tasks: list[Any] = field(default_factory=list)
    parents: dict[int, list[Any]] = field(default_factory=dict)
    policies: dict[int, str] = field(default_factory=dict)

    def add(self, task: Any, parents: Sequence[Any] = (), policy: str = CHAIN_POLICY) -> None:
        if id(task) in self.parents:
            raise InvalidTaskError(f"Task {task.name} appears twice in one workflow; build "
                                   f"one task per step.")
        self.tasks.append(task)
        self.parents[id(task)] = list(parents)
        self.policies[id(task)] = policy

    def wait(self, tasks: Iterable[Any], parents: Sequence[Any], policy: str) -> None:
        for task in tasks:
            self.parents[id(task)].extend(parents)
            self.policies[id(task)] = policy


class Flow:
    """Steps linked by who waits for whom; :func:`chain` and :func:`group` make them."""

    def _build(self, graph: _Graph) -> tuple[list[Any], list[Any]]:
        """Add this flow's tasks to ``graph``; return its first tasks (those that wait for
        nothing inside it) and its last ones (those nothing inside it waits for)."""
        raise NotImplementedError

    def enqueue(self, *, using: str | None = None,
                workflow_id: uuid.UUID | None = None) -> Workflow:
        """Insert every task of the workflow, all or nothing, in the caller's transaction;
        return the :class:`Workflow`."""
        from django_pgtasks.models import Task

        graph = _Graph()
        self._build(graph)
        tasks = graph.tasks
        pk = Task.objects.enqueue_linked(
            tasks, [graph.parents[id(t)] for t in tasks],
            on_parent_failure=[graph.policies[id(t)] for t in tasks],
            workflow_id=workflow_id or uuid.uuid4(), using=using)
        return Workflow(pk, tasks)


def _step(step: Any) -> Flow:
    if isinstance(step, Flow):
        return step
    from django_pgtasks.models import Task

    if isinstance(step, Task):
        return _One(step)
    raise InvalidTaskError(
        f"A workflow step is an unsaved task (handler.build(...)), a chain or a group, not "
        f"{type(step).__name__} {step!r:.50}.")


@dataclass
class _One(Flow):
    task: Any

    def _build(self, graph: _Graph) -> tuple[list[Any], list[Any]]:
        graph.add(self.task)
        return [self.task], [self.task]


class chain(Flow):
    """Steps that run one after the other: each waits for every last task of the step
    before it, and runs only if they all succeeded (else it ends ``CANCELLED``, and so do the
    steps after it), unless ``on_parent_failure`` says otherwise (``"run"``, ``"fail"``)."""

    def __init__(self, *steps: Any, on_parent_failure: str = CHAIN_POLICY) -> None:
        if not steps:
            raise InvalidTaskError("A chain needs at least one step.")
        self.steps = [_step(step) for step in steps]
        self.on_parent_failure = on_parent_failure

    def _build(self, graph: _Graph) -> tuple[list[Any], list[Any]]:
        first, last = self.steps[0]._build(graph)
        for step in self.steps[1:]:
            heads, tails = step._build(graph)
            graph.wait(heads, last, self.on_parent_failure)
            last = tails
        return first, last


class group(Flow):
    """Members that run in parallel and, with ``then``, a callback that runs exactly once,
    when every member has ended, whatever their outcomes (``on_parent_failure="run"``; it
    reads them with ``context.parents()``). ``on_parent_failure="skip"`` or ``"fail"`` runs
    the callback only if every member succeeded."""

    def __init__(self, members: Iterable[Any], *, then: Any = None,
                 on_parent_failure: str = CALLBACK_POLICY) -> None:
        self.members = [_step(member) for member in members]
        if not self.members:
            raise InvalidTaskError("A group needs at least one member.")
        self.then = _step(then) if then is not None else None
        self.on_parent_failure = on_parent_failure

    def _build(self, graph: _Graph) -> tuple[list[Any], list[Any]]:
        heads: list[Any] = []
        tails: list[Any] = []
        for member in self.members:
            first, last = member._build(graph)
            heads += first
            tails += last
        if self.then is None:
            return heads, tails
        first, last = self.then._build(graph)
        graph.wait(first, tails, self.on_parent_failure)
        return heads, last


class Workflow:
    """An enqueued workflow: its id and its tasks, saved, in the order they were built."""

    def __init__(self, pk: uuid.UUID, tasks: Sequence[Any]) -> None:
        self.id = pk
        self.tasks = list(tasks)

    def __repr__(self) -> str:
        return f"<Workflow {self.id} ({len(self.tasks)} tasks)>"

    @property
    def using(self) -> str:
        return self.tasks[0]._state.db

    def members(self) -> Any:
        """Every task of the workflow (a queryset, read afresh), including tasks enqueued
        later with ``depends_on`` on one of its tasks."""
        return members(self.id, using=self.using)

    def cancel(self) -> Any:
        """Cancel the workflow: tasks not started end ``CANCELLED`` (their dependents see
        it), running ones are asked to stop; see ``TaskQuerySet.cancel()``."""
        return self.members().cancel()


def members(workflow_id: uuid.UUID, using: str | None = None) -> Any:
    """The tasks of workflow ``workflow_id``, a queryset."""
    from django_pgtasks.models import Task

    tasks = Task.objects.using(using) if using else Task.objects.all()
    return tasks.filter(workflow_member__workflow_id=workflow_id)


def cancel(workflow_id: uuid.UUID, using: str | None = None) -> Any:
    """Cancel workflow ``workflow_id`` (see :meth:`Workflow.cancel`)."""
    return members(workflow_id, using=using).cancel()
