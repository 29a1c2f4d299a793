"""Sphinx configuration of the django-pgtasks documentation.

Build it strictly, as CI does (warnings are errors)::

    python -m pip install -e ".[docs]"
    python -m sphinx -W --keep-going -b html docs docs/_build/html

Why Sphinx with MyST: Sphinx is what Django itself and most Django packages (Celery,
django-allauth, channels, ...) build their documentation with, and what Read the Docs serves by
default; autodoc generates the API reference from the docstrings, and a warning-free build
(``-W``) catches broken links and references. MyST lets the pages stay Markdown, readable on
the repository host as they are. autodoc imports the package under a minimal settings module
(``docs/settings.py``); no database connection is made.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import django

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "docs.settings")
django.setup()

project = "django-pgtasks"
author = "django-pgtasks contributors"
copyright = "django-pgtasks contributors"
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]

# MyST: anchors for headings (links such as settings.md#queues), definition lists, and
# fenced blocks marked {eval-rst} or {autofunction} where autodoc is used.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]
# Links to files outside the documentation (the example project, the tests) point at the
# source repository.
myst_url_schemes = {
    "http": None,
    "https": None,
    "mailto": None,
    "source": "https://github.com/django-pgtasks/django-pgtasks/blob/main/{{path}}",
}

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}
# The Django tasks framework is optional; autodoc must not fail where it is missing.
autodoc_mock_imports: list[str] = []

html_theme = "furo"
html_title = "django-pgtasks"
html_static_path: list[str] = []
pygments_style = "sphinx"
