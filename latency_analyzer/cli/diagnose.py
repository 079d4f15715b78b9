"""``latency-analyzer probe URL --count N --diagnose`` and ``latency-analyzer diagnose RUN.jsonl``.

``probe --count N`` sends N requests on one client: the first is cold (DNS, TCP, TLS), the rest
reuse its connection. ``--diagnose`` then asks the server which protocol it prefers (an ALPN
probe through the same resolver and CA options as the requests) and prints the findings for the
cold request, ranked by the milliseconds of TTFT (a stream) or e2e at stake, each with its
what-if, and the combined what-if of every client-side remedy. ``diagnose RUN.jsonl`` does the
same for a run file written by ``latency-analyzer run``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
from collections.abc import Sequence
from typing import Any

from .._runfile import read_run
from ..analysis.diagnose import Finding, WhatIf, diagnose, format_findings, what_if
from ..capture.alpn import aprobe_alpn
from ..capture.client import Client
from ..errors import UsageError
from ..report.waterfall_text import render_waterfall
from ..timeline import Waterfall

__all__ = ["add_diagnose_parser", "cmd_diagnose", "probe_many"]


def _context(args: argparse.Namespace) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=args.cacert) if args.cacert else None


async def _requests(args: argparse.Namespace, request: dict[str, Any]) -> list[Waterfall]:
    client = Client(
        resolver=args.resolver,
        ssl=_context(args),
        insecure=args.insecure,
        timeout=args.timeout,
        http2=args.http2,
    )
    async with client:
        return [await client.request(args.url, **request) for _ in range(args.count)]


async def _alpn(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The server's ALPN choice, or why it could not be asked."""
    try:
        picked = await aprobe_alpn(
            args.url,
            resolver=args.resolver,
            ssl=_context(args),
            insecure=args.insecure,
            timeout=min(args.timeout, 10.0),
        )
    except OSError as exc:
        return None, str(exc)
    return picked, None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _cold_vs_warm(cold: Waterfall, warm: Sequence[Waterfall]) -> str:
    """Per stage: the cold request beside the median of the warm ones."""
    ok = [wf for wf in warm if wf.ok]
    names = list(dict.fromkeys([*cold.attribution(), *(s for wf in ok for s in wf.attribution())]))
    rows = [("stage", "cold", f"warm (median of {len(ok)})")]
    for name in names:
        warm_s = statistics.median(wf.attribution().get(name, 0.0) for wf in ok) if ok else None
        rows.append((name, _ms(cold.attribution().get(name, 0.0)), _ms(warm_s)))
    for metric in ("ttft", "e2e"):
        values = [getattr(wf, metric) for wf in ok if getattr(wf, metric) is not None]
        rows.append(
            (metric, _ms(getattr(cold, metric)), _ms(statistics.median(values) if values else None))
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(
        f"  {a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}".rstrip() for a, b, c in rows
    )


def _diagnosis(
    data: Waterfall | Sequence[Waterfall], findings: list[Finding]
) -> tuple[list[Finding], WhatIf]:
    """The findings and the combined what-if of their client-side remedies."""
    return findings, what_if(data, findings)


def _payload(findings: list[Finding], w: WhatIf) -> dict[str, Any]:
    return {"findings": [f.to_dict() for f in findings], "what_if": w.to_dict()}


def probe_many(args: argparse.Namespace, request: dict[str, Any]) -> int:
    """``probe --count N [--diagnose]``: exit 0 when every request succeeded, else 1."""
    if args.count < 1:
        raise UsageError(f"--count must be at least 1, got {args.count}")
    wfs = asyncio.run(_requests(args, request))
    cold, warm = wfs[0], wfs[1:]
    alpn, alpn_error = asyncio.run(_alpn(args)) if args.diagnose else (None, None)
    cold_dx = _diagnosis(cold, diagnose(cold, server_alpn=alpn)) if args.diagnose else None
    ok_warm = [wf for wf in warm if wf.ok]
    warm_dx = None
    if args.diagnose and ok_warm:
        warm_dx = _diagnosis(ok_warm, diagnose(ok_warm, server_alpn=alpn))
    if args.json:
        out: dict[str, Any] = {"requests": [wf.summary() for wf in wfs]}
        if args.diagnose:
            assert cold_dx is not None
            out["server_alpn"] = alpn
            out["alpn_error"] = alpn_error
            out["cold"] = _payload(*cold_dx)
            out["warm"] = None if warm_dx is None else _payload(*warm_dx)
        print(json.dumps(out))
        return 0 if all(wf.ok for wf in wfs) else 1
    print(f"== cold: request 1 of {len(wfs)}, new connection")
    print(render_waterfall(cold, colour=args.colour))
    if warm:
        print(f"\n== cold vs warm (requests 2..{len(wfs)} reuse the connection)")
        print(_cold_vs_warm(cold, warm))
    if cold_dx is not None:
        said = alpn if alpn is not None else f"unknown ({alpn_error})" if alpn_error else "none"
        print(f"\n== diagnosis of the cold request (server's ALPN choice: {said})")
        if cold.ok:
            print(format_findings(cold_dx[0]))
            print(cold_dx[1])
        else:  # its error_type says what broke; the rules read successful requests only
            print(f"the request failed ({cold.error_type}): see its error above")
    if warm_dx is not None:
        print(f"\n== diagnosis of the {len(ok_warm)} warm requests")
        print(format_findings(warm_dx[0]))
    return 0 if all(wf.ok for wf in wfs) else 1


def add_diagnose_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``diagnose RUN.jsonl``."""
    p = subparsers.add_parser("diagnose", help="find root causes in a run file (JSONL)")
    p.add_argument("run", metavar="RUN.jsonl", help="written by `latency-analyzer run --out`")
    p.add_argument(
        "--server-alpn",
        choices=("h2", "http/1.1"),
        help="what the server selects when offered h2 (lets the HTTP/1.1 rule speak)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Findings for a whole run, and the combined what-if; exit 0 (2: the file is bad)."""
    rows = list(read_run(args.run))
    wfs = [wf for wf, tags in rows if not tags.warmup]
    findings = diagnose(wfs, server_alpn=args.server_alpn)
    w = what_if(wfs, findings) if wfs else WhatIf("e2e", 0.0, 0.0, (), ())
    failed = sum(not wf.ok for wf in wfs)
    warmup = len(rows) - len(wfs)
    counts = {"requests": len(rows), "warmup": warmup, "failed": failed}
    if args.json:
        print(json.dumps({"run": str(args.run), "counts": counts, **_payload(findings, w)}))
        return 0
    print(
        f"{args.run}: {len(rows)} requests ({warmup} warm-up, left out; {failed} failed, left out)"
    )
    print(format_findings(findings))
    print(w)
    return 0
