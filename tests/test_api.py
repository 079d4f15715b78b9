"""The public surface and the layering: pinned names, imports read from the source, frozen model.

Layering is checked with ``ast`` over the source files (relative imports resolved), never by
importing, so an import hidden in a function or under ``TYPE_CHECKING`` counts too.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.metadata
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

import latency_analyzer as la
import latency_analyzer.analysis.diagnose as dx
import latency_analyzer.diagnose as old_dx
import latency_analyzer.testing as testbed
from latency_analyzer import CLIENT_STAGES, RESIDUALS, Recorder, Span, Waterfall

PACKAGE = "latency_analyzer"
ROOT = Path(la.__file__).resolve().parent

PUBLIC = [
    "CLIENT_STAGES",
    "RESIDUALS",
    "SERVER_STAGES",
    "Client",
    "ClockAnchor",
    "ConnectionInfo",
    "LatencyAnalyzerError",
    "Recorder",
    "RequestError",
    "Span",
    "TcpInfo",
    "TlsInfo",
    "UsageError",
    "Waterfall",
    "__version__",
    "aprobe",
    "probe",
]

TESTING_PUBLIC = [
    "FAULTS",
    "SERVER_NAMES",
    "ALPNLLMServer",
    "Behavior",
    "DNSQuery",
    "DNSServer",
    "DelayProxy",
    "H2LLMServer",
    "H2StreamRecord",
    "Handshake",
    "LLMServer",
    "RequestRecord",
    "SubprocessLLMServer",
    "TestBed",
    "TestCA",
    "sleep_until",
    "token_text",
]

DIAGNOSE_PUBLIC = [
    "CLIENT_REMEDIES",
    "RULES",
    "Finding",
    "Thresholds",
    "WhatIf",
    "diagnose",
    "format_findings",
    "what_if",
]

IO_LIBRARIES = {"aiohttp", "dns", "ssl", "socket", "asyncio"}


# --- (a) the public API ---------------------------------------------------------------------


def test_public_names_are_pinned() -> None:
    assert la.__all__ == PUBLIC  # in ruff's RUF022 order: constants, classes, functions


def test_testing_names_are_pinned() -> None:
    assert testbed.__all__ == TESTING_PUBLIC


def test_diagnose_names_are_pinned() -> None:
    assert dx.__all__ == DIAGNOSE_PUBLIC


def test_the_old_diagnose_path_re_exports_the_package() -> None:
    """``latency_analyzer.diagnose`` keeps its names, each the package's own object."""
    for name in DIAGNOSE_PUBLIC:
        assert getattr(old_dx, name) is getattr(dx, name), name
    assert old_dx.diagnose_set is dx.diagnose
    from latency_analyzer.capture import alpn

    assert (old_dx.probe_alpn, old_dx.aprobe_alpn) == (alpn.probe_alpn, alpn.aprobe_alpn)


@pytest.mark.parametrize(
    ("module", "names"), [(la, PUBLIC), (testbed, TESTING_PUBLIC), (dx, DIAGNOSE_PUBLIC)]
)
def test_every_public_name_is_importable(module: object, names: list[str]) -> None:
    for name in names:
        assert getattr(module, name) is not None, name
    namespace: dict[str, object] = {}
    exec(f"from {module.__name__} import *", namespace)  # type: ignore[attr-defined]  # a module, passed as object by parametrize
    assert set(names) - {"__version__"} <= namespace.keys()


def test_version_matches_the_distribution() -> None:
    assert la.__version__ == importlib.metadata.version("latency-analyzer")


def test_exceptions_form_one_tree() -> None:
    assert issubclass(la.UsageError, la.LatencyAnalyzerError)
    assert issubclass(la.UsageError, ValueError)
    assert issubclass(la.RequestError, la.LatencyAnalyzerError)
    assert not issubclass(la.RequestError, la.UsageError)
    err = la.RequestError("tls", "certificate verify failed")
    assert (err.kind, err.message) == ("tls", "certificate verify failed")
    assert str(err) == "tls: certificate verify failed"


# --- (b) layering, read from the source ------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def _known_modules() -> set[str]:
    return {_module_name(p) for p in ROOT.rglob("*.py")}


def _imports(path: Path, nodes: Iterable[ast.AST] | None = None) -> Iterator[str]:
    """Every module ``path`` imports, absolute, at any depth of the file (functions included),
    or only those of ``nodes`` (parts of its tree) when given.

    ``from X import name`` yields ``X.name`` when that is a module of this package (a submodule
    import), else ``X``.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    me = _module_name(path)
    package = me if _is_package(path) else me.rpartition(".")[0]
    known = _known_modules()
    for node in ast.walk(tree) if nodes is None else nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in known else base


def _files(subpackage: str) -> list[Path]:
    target = ROOT / subpackage
    files = sorted(target.rglob("*.py")) if target.is_dir() else [target.with_suffix(".py")]
    assert files and all(f.exists() for f in files), subpackage
    return files


def _internal(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _under(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(subpackage: str, allowed: tuple[str, ...], banned: set[str]) -> list[str]:
    """Imports from ``subpackage`` into the package outside ``allowed``, or of ``banned`` libs."""
    out = []
    for path in _files(subpackage):
        for name in _imports(path):
            top = name.split(".")[0]
            if (_internal(name) and not _under(name, *allowed)) or top in banned:
                out.append(f"{path.relative_to(ROOT)} imports {name}")
    return out


def test_the_import_reader_resolves_relative_and_absolute_imports() -> None:
    """Not vacuous: known imports are found, relative ones resolved to absolute names."""
    assert "latency_analyzer.errors" in set(_imports(ROOT / "timeline" / "_recorder.py"))
    assert "latency_analyzer.timeline._clock" in set(_imports(ROOT / "timeline" / "_recorder.py"))
    assert "latency_analyzer.timeline._recorder" in set(_imports(ROOT / "timeline/__init__.py"))
    cli = set(_imports(ROOT / "cli" / "probe.py"))
    assert {"latency_analyzer.capture.client", "latency_analyzer.cli.diagnose", "ssl"} <= cli
    assert "latency_analyzer" in set(_imports(ROOT / "cli" / "__init__.py"))  # its __version__
    assert "latency_analyzer.demo" in set(_imports(ROOT / "cli" / "demo.py"))  # a lazy import
    assert "latency_analyzer.capture.sse" in set(_imports(ROOT / "capture" / "openai.py"))
    assert "aiohttp" in set(_imports(ROOT / "capture" / "client.py"))
    # and the checker flags what it should: capture uses aiohttp and more than the timeline
    flagged = _violations("capture", ("latency_analyzer.timeline",), {"aiohttp"})
    assert any(v.endswith("imports aiohttp") for v in flagged)
    assert any(v.endswith("imports latency_analyzer.errors") for v in flagged)


PRESENTATION = ("latency_analyzer.report", "latency_analyzer.diagnose")


def test_timeline_and_errors_are_pure() -> None:
    """The model imports only itself, the exceptions, the redaction point (pure string
    functions: what a summary or an error message may show) and the percentile definition
    (the clock offsets' edge estimates take their ranks from it), no I/O library, and no
    presentation, not even inside a method: ``wf.plot()`` and the notebook reprs go through
    registered presenters (``timeline._display``)."""
    allowed = (
        "latency_analyzer.timeline",
        "latency_analyzer.errors",
        "latency_analyzer._redact",
        "latency_analyzer._rank",
    )
    assert [
        v for sub in ("timeline", "errors") for v in _violations(sub, allowed, IO_LIBRARIES)
    ] == []


def _imports_of(subpackage: str, *targets: str) -> list[str]:
    """Imports from ``subpackage`` of anything under ``targets``."""
    return [
        f"{p.relative_to(ROOT)} imports {name}"
        for p in _files(subpackage)
        for name in _imports(p)
        if _under(name, *targets)
    ]


_ABOVE_CAPTURE = (
    "latency_analyzer.server",
    "latency_analyzer.merge",
    "latency_analyzer._merge",
    "latency_analyzer.analysis",
    "latency_analyzer.load",
    "latency_analyzer.report",
    "latency_analyzer.pytest_plugin",
    "latency_analyzer.cli",
    "latency_analyzer.demo",
)


def test_capture_does_not_import_upward() -> None:
    assert _imports_of("capture", *_ABOVE_CAPTURE) == []
    # nor the package root, which re-exports capture itself (a cycle in disguise)
    assert not any(name == PACKAGE for p in _files("capture") for name in _imports(p))


def test_testing_is_standalone() -> None:
    """The test bed imports nothing of the package but leaf helpers; its synthetic
    waterfalls (``testing/waterfalls.py``) also the model they are made of, and no other
    module of the test bed imports them, so ``import latency_analyzer.testing`` stays light."""
    allowed = (
        "latency_analyzer.testing",
        "latency_analyzer._threads",
        "latency_analyzer._sockets",
    )  # leaf helpers
    model = "testing/waterfalls.py imports latency_analyzer.timeline"
    assert [v for v in _violations("testing", allowed, set()) if v != model] == []
    assert _imports_of("testing", "latency_analyzer.testing.waterfalls") == []


def test_report_does_not_import_capture() -> None:
    assert _imports_of("report", "latency_analyzer.capture") == []


def test_server_side_knows_only_the_model() -> None:
    """Span receivers and schema mappings read server data; they never send requests."""
    above = ("latency_analyzer.capture", *_ABOVE_CAPTURE[1:])
    assert _imports_of("server", *above) == []


def test_analysis_does_not_reach_into_capture_load_or_presentation() -> None:
    banned = ("latency_analyzer.capture", "latency_analyzer.load", *PRESENTATION)
    found = _imports_of("analysis", *banned, "latency_analyzer.cli", "latency_analyzer.server")
    assert found == []


def test_the_model_still_plots_and_diagnoses_through_its_presenters() -> None:
    """Not vacuous: the registered presenters answer the model's calls."""
    wf = _recorded()
    assert "<" in wf._repr_html_()
    assert isinstance(wf.diagnose(), list)


def test_metrics_do_not_reach_into_load_or_presentation() -> None:
    banned = ("latency_analyzer.load", "latency_analyzer.report", "latency_analyzer.cli")
    assert _imports_of("metrics", *banned, "latency_analyzer.testing") == []


def test_profile_reads_the_model_only() -> None:
    banned = ("latency_analyzer.capture", "latency_analyzer.report", "latency_analyzer.load")
    assert _imports_of("profile", *banned, "latency_analyzer.cli", "latency_analyzer.testing") == []


def test_load_does_not_use_the_test_bed_or_presentation() -> None:
    banned = ("latency_analyzer.testing", "latency_analyzer.report", "latency_analyzer.demo")
    assert _imports_of("load", *banned, "latency_analyzer.pytest_plugin") == []


# --- (c) the model is frozen; attribution speaks the stage vocabulary ------------------------


def _recorded(intended: bool = False) -> Waterfall:
    rec = Recorder(
        "POST", "http://h.test/v1", start_ns=1_000, intended_start_ns=500 if intended else None
    )
    rec.add("pool_wait", 1_000, 1_100)
    rec.add("connect", 1_100, 1_400)
    rec.add("send", 1_450, 1_500)
    rec.response_headers(2_000, 200)
    rec.chunk(3_000, 4)
    rec.chunk(3_500, 4)
    rec.usage(3, 2)
    return rec.finish(3_600)


def test_waterfall_is_frozen() -> None:
    wf = _recorded()
    with pytest.raises(dataclasses.FrozenInstanceError):
        wf.error = "changed"  # type: ignore[misc]  # frozen: the point of the check
    with pytest.raises(dataclasses.FrozenInstanceError):
        wf.root = wf.root  # type: ignore[misc]  # frozen: the point of the check
    with pytest.raises(TypeError):
        wf.attributes["x"] = 1  # type: ignore[index]  # read-only mapping: the point of the check
    with pytest.raises(dataclasses.FrozenInstanceError):
        wf.root.end_ns = 0  # type: ignore[misc]  # frozen: the point of the check
    with pytest.raises(TypeError):
        wf.root.attributes["x"] = 1  # type: ignore[index]  # read-only mapping: the point of the check
    assert isinstance(wf.root.children, tuple)
    assert isinstance(wf.chunk_times_ns, tuple)
    assert dataclasses.is_dataclass(wf)
    assert all(type(s).__dataclass_params__.frozen for s in (wf, wf.root))  # type: ignore[attr-defined]  # set by @dataclass, unknown to the type


def test_span_is_frozen_and_checks_its_interval() -> None:
    span = Span("dns", 10, 20)
    with pytest.raises(dataclasses.FrozenInstanceError):
        span.name = "tls"  # type: ignore[misc]  # frozen: the point of the check
    with pytest.raises(la.UsageError):
        Span("dns", 20, 10)


VOCABULARY = set(CLIENT_STAGES) | set(RESIDUALS)


@pytest.mark.parametrize("intended", [False, True])
def test_attribution_keys_come_from_the_vocabulary(intended: bool) -> None:
    wf = _recorded(intended)
    attribution = wf.attribution_ns()
    assert set(attribution) <= VOCABULARY
    assert sum(attribution.values()) == wf.e2e_ns
    expected = {"pool_wait", "connect", "send", "wait", "first_token", "decode", "tail", "other"}
    assert set(attribution) == expected | ({"schedule_lag"} if intended else set())
    assert list(attribution)[-1] == "other"


def test_attribution_of_real_requests_uses_the_vocabulary() -> None:
    from latency_analyzer.testing import LLMServer

    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with LLMServer(tokens=3).run_in_thread() as server:
        ok = la.probe(server.url + "/v1/chat/completions", json=body)
        failed = la.probe(
            server.url + "/v1/chat/completions",
            json={**body, "testbed": {"fault": "reset", "fault_after": 1}},
        )
    assert ok.ok and not failed.ok
    for wf in (ok, failed):
        assert set(wf.attribution()) <= VOCABULARY, wf.attribution()
        assert {s.name for s in wf.root.children} <= set(CLIENT_STAGES)
        assert sum(wf.attribution_ns().values()) == wf.e2e_ns


def test_the_vocabulary_is_the_designs() -> None:
    assert CLIENT_STAGES == (
        "schedule_lag",
        "pool_wait",
        "dns",
        "connect",
        "tls",
        "h2_setup",
        "send",
        "wait",
        "first_token",
        "decode",
        "tail",
    )
    assert RESIDUALS == ("network", "other")
    assert la.SERVER_STAGES == ("server_queue", "preprocess", "prefill", "decode", "postprocess")


@pytest.mark.parametrize(
    "name",
    ["latency_analyzer.cli", "latency_analyzer.demo", "latency_analyzer.report.waterfall_text"],
)
def test_public_modules_import_cleanly(name: str) -> None:
    """In a fresh interpreter, with every warning an error: the import says nothing and loads
    none of the optional extras (plots, dataframes, Ray, the CLI's tables): those wait until
    they are used."""
    code = (
        f"import sys, {name}\n"
        "print(sorted(m for m in ('matplotlib', 'pandas', 'pyarrow', 'ray', 'rich', 'locust')"
        " if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "[]\n")


# --- (d) no import cycle, function-level imports counted --------------------------------------


def _runtime_imports(path: Path) -> set[str]:
    """Modules of this package ``path`` imports at run time: at any depth (functions
    included), but not inside ``if TYPE_CHECKING:`` blocks, which name types and run nothing."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    nodes = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Import | ast.ImportFrom) and id(n) not in typing_only
    ]
    return {name for name in _imports(path, nodes) if _internal(name)}


def _import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in ROOT.rglob("*.py")}
    return {mod: _runtime_imports(path) - {mod} for mod, path in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_its_way_back_to_itself() -> None:
    """Every import counts, inside functions too (a lazy import is still an edge): the
    layers hold only if following them never comes back."""
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_finds_cycles() -> None:
    """Not vacuous: a lazy import back up the layers is a cycle, and it is found."""
    graph = _import_graph()
    graph["latency_analyzer.timeline._waterfall"].add("latency_analyzer.report.plot")
    assert any("latency_analyzer.timeline._waterfall" in c for c in _cycles(graph))
    assert "latency_analyzer.capture.client" in graph["latency_analyzer.load._runner"]
