"""What the package index shows and the wheel ships: the license, the classifiers, a README
whose links and code work outside the repository."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
README = (ROOT / "README.md").read_text()


@pytest.mark.slow
def test_the_wheel_ships_the_license(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(ROOT),
                    "-w", str(tmp_path)], check=True, timeout=600)
    [wheel] = tmp_path.glob("django_pgtasks-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        licenses = [n for n in names if n.endswith("/LICENSE") and ".dist-info/" in n]
        assert licenses, names
        assert "BSD 3-Clause License" in archive.read(licenses[0]).decode()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert b"License-Expression: BSD-3-Clause" in metadata


def test_the_classifiers_name_every_django_line_ci_tests() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classifiers = set(project["classifiers"])
    for version in ("5.2", "6.0", "6.1"):
        assert f"Framework :: Django :: {version}" in classifiers
    assert project["license"] == "BSD-3-Clause"
    assert (ROOT / "LICENSE").exists()


def test_the_readme_links_work_on_the_package_index() -> None:
    """The package index shows the README away from the repository: no relative link."""
    targets = re.findall(r"\]\(([^)]+)\)", README)
    assert targets
    relative = [t for t in targets if not re.match(r"https?://|#", t)]
    assert relative == []


def test_the_readme_python_examples_name_everything_they_use() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks
    for block in blocks:
        if "..." in block:  # a settings excerpt
            continue
        tree = ast.parse(block)
        defined = {"print", "str", "int"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                defined.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.FunctionDef):
                defined.add(node.name)
                defined.update(a.arg for a in node.args.args)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.comprehension):
                defined.update(n.id for n in ast.walk(node.target) if isinstance(n, ast.Name))
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)}
        assert used <= defined, (used - defined, block)
