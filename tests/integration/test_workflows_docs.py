"""docs/howto/workflows.md runs as written: its Python blocks, in order, in one namespace.

The handlers the page defines are registered under this namespace's module name, and
``drain()`` runs them inside the test's transaction, as the page says it does. Every
``assert`` of the page is checked. The block of Django's ``@task`` code is left out: it needs
a tasks module of an installed app, and ``test_workflows.py`` runs the same thing
(``::test_django_tasks_as_steps_of_a_group_with_a_callback``).
"""

from __future__ import annotations

import pytest

from django_pgtasks.definition.registry import registered_names
from django_pgtasks.models import Task
from tests.conftest import ROOT
from tests.process.test_docs import code_blocks

PAGE = ROOT / "docs" / "howto" / "workflows.md"


@pytest.mark.django_db
def test_every_example_of_the_workflows_guide_runs() -> None:
    blocks = [body for lang, body in code_blocks(PAGE) if lang == "python"]
    runnable = [body for body in blocks if "from django.tasks import" not in body]
    assert len(blocks) - len(runnable) == 1
    assert len(runnable) >= 6
    namespace = {"__name__": "docs_workflows"}
    text = PAGE.read_text()
    for body in runnable:
        # Compiled at its own lines of the page, so that a failure points at the page's line.
        offset = text[:text.index(body)].count("\n")
        try:
            exec(compile("\n" * offset + body, str(PAGE), "exec"), namespace)
        except AssertionError as exc:
            rows = Task.objects.order_by("id").values_list(
                "id", "name", "status", "result", "error_text")
            raise AssertionError(f"{body}\nfailed; the tasks: {list(rows)}") from exc
    assert "docs_workflows.notify" in registered_names()
