"""Task handlers whose module fails to import while ``PGTASKS_TEST_BREAK_IMPORT`` is set.

For the tests of task names (``tests/process/test_task_names.py``): with the variable unset
the module imports like any other, so it can be made to fail and then to succeed in one process.

- ``raise``: the module raises ``RuntimeError`` after its handlers are registered, as a module
  that breaks half-way through its import does.
- ``dependency``: the module imports a package that is not installed.

Nothing imports this module on its own: it is not named ``tasks.py``, so it is not
autodiscovered.
"""

from __future__ import annotations

import importlib
import os

from django_pgtasks import pgtask
from django_pgtasks.definition.framework import task

#: The environment variable that breaks this module's import, and its values.
FLAG = "PGTASKS_TEST_BREAK_IMPORT"


@pgtask
def some_task() -> str:
    return "imported"


@task
def some_django_task() -> str:
    return "imported"


_how = os.environ.get(FLAG)
if _how == "dependency":
    # Imported by name so that no linter or editor offers to "fix" the missing package.
    importlib.import_module("pgtasks_test_no_such_dependency")
elif _how:
    raise RuntimeError(f"tests.testapp.broken_tasks fails to import while {FLAG} is set.")
