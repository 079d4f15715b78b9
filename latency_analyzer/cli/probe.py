"""``latency-analyzer probe URL``: time one request (or ``--count N``) and show where its time
went; ``--diagnose`` adds the findings."""

from __future__ import annotations

import argparse
import json
import ssl
import sys
from pathlib import Path
from typing import Any

from ..capture.client import probe
from ..report.waterfall_text import render_waterfall
from ..timeline import Waterfall
from .diagnose import probe_many

__all__ = ["add_probe_parser", "cmd_probe"]


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        # the value is not echoed: a mistyped header may hold a secret
        raise argparse.ArgumentTypeError("a header must look like 'Name: value'")
    return name.strip(), value.strip()


def _body(spec: str | None) -> tuple[Any, str | None]:
    """``-d`` as curl reads it (``@file`` from a file); JSON text is sent as JSON."""
    if spec is None:
        return None, None
    text = Path(spec[1:]).read_text(encoding="utf-8") if spec.startswith("@") else spec
    try:
        return json.loads(text), None
    except ValueError:
        return None, text


def add_probe_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``probe``: curl-like request options, the waterfall as text or ``--json``."""
    p = subparsers.add_parser("probe", help="time one request and show where its time went")
    p.add_argument("url", help="http(s) URL, e.g. https://host/v1/chat/completions")
    p.add_argument(
        "-X",
        "--request",
        dest="method",
        metavar="METHOD",
        help="HTTP method (default: POST with -d, else GET)",
    )
    p.add_argument(
        "-H",
        "--header",
        dest="headers",
        action="append",
        type=_header,
        default=[],
        metavar="'NAME: VALUE'",
        help="a request header (repeatable); never printed or stored",
    )
    p.add_argument("-d", "--data", metavar="DATA|@FILE", help="request body; JSON is sent as JSON")
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object: e2e_s, ttft_s, stages (seconds; they sum to e2e_s), ...",
    )
    p.add_argument(
        "--count",
        type=int,
        default=1,
        metavar="N",
        help="send N requests on one client: the first cold, the rest warm (default: 1)",
    )
    p.add_argument(
        "--diagnose",
        action="store_true",
        help="ask the server for its ALPN choice and print the findings with their what-ifs",
    )
    p.add_argument("--resolver", metavar="HOST:PORT", help="ask this DNS server (default: system)")
    p.add_argument(
        "--insecure", "-k", action="store_true", help="do not verify the TLS certificate"
    )
    p.add_argument("--cacert", metavar="PATH", help="trust this CA bundle (PEM)")
    p.add_argument(
        "-L",
        "--location",
        action="store_true",
        help="follow redirects, each hop a request of its own (default: report the 3xx)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="whole request (default: %(default)s)",
    )
    p.add_argument("--no-color", action="store_true", help="plain text even on a terminal")
    version = p.add_mutually_exclusive_group()
    version.add_argument(
        "--http2",
        dest="http2",
        action="store_true",
        default=None,
        help="require HTTP/2 (ALPN h2; prior-knowledge h2c for http://)",
    )
    version.add_argument(
        "--http1.1", dest="http2", action="store_false", help="HTTP/1.1 only (no ALPN h2)"
    )
    p.set_defaults(func=cmd_probe)


def _print(wf: Waterfall, as_json: bool, colour: bool) -> None:
    if as_json:
        print(json.dumps(wf.summary()))
    else:
        print(render_waterfall(wf, colour=colour))


def cmd_probe(args: argparse.Namespace) -> int:
    body, data = _body(args.data)
    if args.count != 1 or args.diagnose:
        args.colour = sys.stdout.isatty() and not args.no_color
        request = {"method": args.method, "json": body, "data": data, "headers": dict(args.headers)}
        return probe_many(args, request)
    context = ssl.create_default_context(cafile=args.cacert) if args.cacert else None
    wf = probe(
        args.url,
        method=args.method,
        json=body,
        data=data,
        headers=dict(args.headers),
        resolver=args.resolver,
        ssl=context,
        insecure=args.insecure,
        timeout=args.timeout,
        http2=args.http2,
        follow_redirects=args.location,
    )
    _print(wf, args.json, sys.stdout.isatty() and not args.no_color)
    return 0 if wf.ok else 1
