"""The public API, pinned: every public namespace says what it exports, and says all of it.

A public namespace is the package root, every package whose dotted path has no part with a
leading underscore (found by walking the package, so a new one is held to this at once), and
the public modules listed in ``MODULES``. In each, as httpx pins its root
(``tests/test_exported_members.py``): every public attribute is in ``__all__`` and every name
in ``__all__`` exists. Module objects are namespaces, not members (submodules, and modules
imported to be used by name); so are ``from __future__`` features. The pytest plugin's hook
functions are called by pytest by name and stay out of ``__all__``: a ``from ... import *`` in
a conftest would register them twice.

Names load lazily in several namespaces (the client, plots, Locust), and loading Locust
monkey-patches the process: each namespace is read in a fresh interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import latency_analyzer

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["latency_analyzer.errors", "latency_analyzer.diagnose", "latency_analyzer.merge"]
PYTEST_PLUGIN = "latency_analyzer.pytest_plugin"


def _public(name: str) -> bool:
    return not any(part.startswith("_") for part in name.split("."))


def _namespaces() -> list[str]:
    found = ["latency_analyzer"]
    for info in pkgutil.walk_packages(latency_analyzer.__path__, "latency_analyzer."):
        if info.ispkg and _public(info.name):
            found.append(info.name)
    return [*found, *MODULES]


NAMESPACES = _namespaces()

_READER = """
import __future__, importlib, json, sys, types

plugin, *namespaces = sys.argv[1:]
out = {}
for name in namespaces:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    members = sorted(
        key for key, value in vars(module).items()
        if not key.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, __future__._Feature)
        and not (name == plugin and key.startswith("pytest_"))
    )
    out[name] = {
        "all": exported,
        "members": members,
        "missing": [n for n in exported or () if not hasattr(module, n)],
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def surfaces() -> dict[str, dict[str, list[str] | None]]:
    done = subprocess.run(
        [sys.executable, "-c", _READER, PYTEST_PLUGIN, *NAMESPACES],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, dict[str, list[str] | None]] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("name", NAMESPACES)
def test_all_names_every_public_member(
    name: str, surfaces: dict[str, dict[str, list[str] | None]]
) -> None:
    surface = surfaces[name]
    exported = surface["all"]
    assert exported is not None, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    assert surface["missing"] == [], f"{name}.__all__ names what it does not have"
    unlisted = sorted(set(surface["members"] or ()) - set(exported))
    assert unlisted == [], f"{name} has public names outside __all__"


def test_the_namespaces_found_include_the_documented_ones() -> None:
    """The walk finds packages: a broken walk would pin nothing."""
    documented = {
        "latency_analyzer",
        "latency_analyzer.analysis",
        "latency_analyzer.analysis.diagnose",
        "latency_analyzer.capture",
        "latency_analyzer.load",
        "latency_analyzer.metrics",
        "latency_analyzer.profile",
        "latency_analyzer.pytest_plugin",
        "latency_analyzer.report",
        "latency_analyzer.server",
        "latency_analyzer.testing",
        "latency_analyzer.timeline",
    }
    assert documented <= set(NAMESPACES)


# -- docs and examples import only public names -------------------------------------------------

_FROM = re.compile(r"^\s*from\s+(latency_analyzer[\w.]*)\s+import\s+(\([^)]*\)|[^#\n]+)", re.M)
_IMPORT = re.compile(r"^\s*import\s+(latency_analyzer[\w.]*)", re.M)


def _doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return files + sorted((ROOT / "examples").rglob("*.py"))


def _imports(text: str) -> list[tuple[str, str | None]]:
    found: list[tuple[str, str | None]] = [(m[1], None) for m in _IMPORT.finditer(text)]
    for match in _FROM.finditer(text):
        names = " ".join(line.split("#")[0] for line in match[2].strip("()").splitlines())
        for item in names.split(","):
            name = item.split(" as ")[0].strip()
            if name:
                found.append((match[1], name))
    return found


def test_docs_and_examples_import_only_public_names() -> None:
    """Every ``import latency_analyzer...`` and ``from latency_analyzer... import name`` in
    README.md, docs/ and examples/ names a public module, and a name in its ``__all__``."""
    wrong = []
    for path in _doc_files():
        for module, name in _imports(path.read_text(encoding="utf-8")):
            where = f"{path.relative_to(ROOT)}: {module}" + (f" import {name}" if name else "")
            if not _public(module):
                wrong.append(f"{where} (a private module)")
            elif name is not None and not _public(name):
                wrong.append(f"{where} (a private name)")
            elif name is not None:
                exported = getattr(__import__(module, fromlist=["_"]), "__all__", None)
                submodule = f"{module}.{name}"
                if (exported is None or name not in exported) and not _is_module(submodule):
                    wrong.append(f"{where} (not in its __all__)")
    assert wrong == []


def _is_module(name: str) -> bool:
    return _public(name) and importlib.util.find_spec(name) is not None
