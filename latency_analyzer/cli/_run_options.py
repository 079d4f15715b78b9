"""``latency-analyzer run`` flags for what a request carries: model, headers, body, limits.

Each flag is a scenario key (``--max-in-flight`` is ``max_in_flight``) and overrides the
scenario file's or preset's value; the scenario's own checks then say when an option cannot
apply to the chosen loop. Header values given with ``-H`` or read with ``--header-env`` are
sent and never stored or printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..load._checks import check_warmup, request_headers
from ..load._datasets import check_fits, load_dataset
from ..load._lengths import filter_dataset, lengths_for, resolve_lengths
from ..load._scenario import Scenario
from ..load._slo import Slo, parse_slos
from ..load._trace import load_trace

__all__ = ["add_request_arguments", "finish_scenario", "request_overrides"]


def add_request_arguments(p: argparse.ArgumentParser) -> None:
    """Add the request flags to the ``run`` parser."""
    p.add_argument("--model", help="the request body's model (default: the scenario's)")
    p.add_argument(
        "-H",
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="a header sent with every request (repeatable); never stored",
    )
    p.add_argument(
        "--header-env",
        action="append",
        default=[],
        metavar="NAME=ENVVAR",
        help="a header whose value is read from an environment variable (repeatable)",
    )
    p.add_argument(
        "--max-in-flight", type=int, metavar="N", help="open loop: requests in flight at most"
    )
    p.add_argument("--max-tokens", type=int, metavar="N", help="max_tokens asked for")
    p.add_argument(
        "--min-tokens", type=int, metavar="N", help="min_tokens asked for (vLLM, SGLang)"
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        default=None,
        help="ask the server to ignore end-of-sequence (vLLM, SGLang): outputs run to max_tokens",
    )
    p.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="a local tokenizer.json or tokenizer folder: prompt lengths built and measured in "
        "tokens (never downloaded; without it lengths are words, marked approximate)",
    )
    p.add_argument(
        "--body-extra", metavar="JSON", help="a JSON object merged into every request body"
    )
    p.add_argument(
        "--dataset", metavar="PATH", help="prompts from a .jsonl, a .csv or a folder of .txt"
    )
    p.add_argument("--dataset-field", metavar="NAME", help="the dataset's key or column")
    p.add_argument("--dataset-sample", choices=("random", "sequential"), help="how rows are drawn")
    p.add_argument(
        "--trace", metavar="PATH", help="replay a request log (.jsonl/.csv) at its instants"
    )
    p.add_argument("--speed", type=float, metavar="X", help="trace replay speed (2: twice as fast)")
    p.add_argument(
        "--read-batching",
        type=float,
        metavar="SECONDS",
        help="the longest a busy stream's read may wait to be batched with others' (default "
        "0.00025, at most 0.005; 0: read each at once). Arrival times are the kernel's stamps "
        "either way",
    )
    p.add_argument(
        "--slo",
        type=_slos,
        metavar="KEY=DURATION,...",
        help="objectives checked after the run, with goodput (requests meeting every one per "
        "second), e.g. ttft_p95=800ms,tpot_p99=50ms (the pytest budgets' keys)",
    )


def _slos(text: str) -> list[Slo]:
    try:
        return parse_slos(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: Flags added to the scenario's own tables rather than replacing them.
_MERGED = ("headers", "header_env", "body_extra")


def request_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The plain scenario keys the request flags set (only those given).

    Raises:
        UsageError: see :func:`_flags`.
    """
    return {k: v for k, v in _flags(args).items() if k not in _MERGED}


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    """The scenario keys the request flags set (only those given).

    Raises:
        UsageError: a malformed ``-H``, ``--header-env`` or ``--body-extra``.
    """
    out: dict[str, Any] = {}
    if args.model is not None:
        out["model"] = args.model
    if args.max_in_flight is not None:
        out["max_in_flight"] = args.max_in_flight
    if args.tokenizer is not None:
        out["tokenizer"] = args.tokenizer
    if args.read_batching is not None:
        out["read_batching"] = args.read_batching
    if args.trace is not None:  # a trace is an open loop: its instants are the schedule
        out["trace"] = {"path": str(Path(args.trace).absolute())}
        if args.mode is None:
            out["mode"] = "open"
    headers: dict[str, str] = {}
    for text in args.header:
        name, sep, value = text.partition(":")
        if not sep or not name.strip():
            raise UsageError("-H/--header: expected 'NAME: VALUE'")  # the text may be a secret
        headers[name.strip()] = value.strip()
    if headers:
        out["headers"] = headers
    env: dict[str, str] = {}
    for text in args.header_env:
        name, sep, var = text.partition("=")
        if not sep or not name.strip() or not var.strip():
            raise UsageError(f"--header-env: expected NAME=ENVVAR, got {text!r}")
        env[name.strip()] = var.strip()
    if env:
        out["header_env"] = env
    if args.body_extra is not None:
        try:
            extra = json.loads(args.body_extra)
        except ValueError as exc:
            raise UsageError(f"--body-extra: not JSON ({exc})") from None
        if not isinstance(extra, dict):
            raise UsageError("--body-extra: expected a JSON object, e.g. '{\"temperature\": 0}'")
        out["body_extra"] = extra
    return out


def finish_scenario(sc: Scenario, args: argparse.Namespace) -> Scenario:
    """Apply what is not a plain scenario key (``-H``, ``--header-env`` and ``--body-extra``
    add to the scenario's tables, ``--max-tokens``, ``--min-tokens`` and ``--ignore-eos``
    set every template's) and check
    the flags the scenario cannot tell were given (a value equal to its default).

    Raises:
        UsageError: ``--concurrency`` on an open loop, ``--max-tokens`` below 1, a
            ``header_env`` variable that is not set.
    """
    given = _flags(args)
    path = None if args.dataset is None else str(Path(args.dataset).absolute())
    dataset = {"path": path, "field": args.dataset_field, "sample": args.dataset_sample}
    dataset = {k: v for k, v in dataset.items() if v is not None}
    if dataset:
        if sc.dataset is None and "path" not in dataset:
            raise UsageError("--dataset-field and --dataset-sample need --dataset PATH")
        given["dataset"] = dataset
    if args.speed is not None:
        if sc.trace is None:
            raise UsageError("--speed applies to a trace replay (--trace PATH or trace = {...})")
        given["trace"] = {"speed": args.speed}
    keys = [k for k in (*_MERGED, "dataset", "trace") if k in given]
    merged = {k: {**(getattr(sc, k) or {}), **given[k]} for k in keys}
    if merged:
        sc = sc.replace(**merged)
    check_warmup(sc)  # a warm-up that takes every request leaves nothing to summarise
    request_headers(sc)  # an unset variable is an error now, before anything runs
    lengths = lengths_for(sc)  # so is a tokenizer that cannot be read
    if sc.dataset is not None:  # or a bad dataset
        check_fits(filter_dataset(load_dataset(sc.dataset), sc.dataset, lengths), sc)
    if sc.trace is not None:  # or trace
        load_trace(sc.trace)
    if sc.mode == "open" and args.concurrency is not None:
        raise UsageError(
            "'concurrency' (--concurrency) applies only to a closed loop (mode = \"closed\"): "
            "an open loop's arrivals follow its schedule; use --rate and --max-in-flight"
        )
    output: dict[str, Any] = {}
    if args.max_tokens is not None:
        if args.max_tokens < 1:
            raise UsageError("--max-tokens must be >= 1")
        output.update(max_tokens=args.max_tokens, output_tokens=None)
    if args.min_tokens is not None:
        if args.min_tokens < 0:
            raise UsageError("--min-tokens must be >= 0")
        output["min_tokens"] = args.min_tokens
    if args.ignore_eos:
        output["ignore_eos"] = True
    if output:  # every template's
        try:
            templates = tuple(dataclasses.replace(t, **output) for t in sc.templates)
        except UsageError as exc:
            raise UsageError(f"--max-tokens/--min-tokens: {exc}") from None
        sc = sc.replace(templates=templates)
    resolve_lengths(sc, lengths)  # an empirical length file that cannot be read, too
    return sc
