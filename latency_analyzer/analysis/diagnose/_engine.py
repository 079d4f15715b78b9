"""Runs the rules, restates each finding in the metric that matters (TTFT for streams, e2e
otherwise) with its what-if, ranks them; and the combined what-if of several remedies."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from ...timeline import CLIENT_STAGES, Waterfall
from .._set import WaterfallSet
from ._facts import Rule, _Context, _from_set, _from_waterfall
from ._findings import CLIENT_REMEDIES, Finding, Thresholds, WhatIf
from ._rules_network import _network, _path_rtt, _slow_connect, _tcp_loss
from ._rules_server import _decode, _jitter, _prefill, _server_queue, _ttfc_gap
from ._rules_setup import _dns, _http1, _new_connection, _pool_wait, _schedule_lag, _tls_resumption

#: Every rule by id, in no particular order (findings are ranked by time at stake).
RULES: Mapping[str, Rule] = MappingProxyType(
    {
        "dns": _dns,
        "new_connection": _new_connection,
        "tls_resumption": _tls_resumption,
        "http1": _http1,
        "pool_wait": _pool_wait,
        "schedule_lag": _schedule_lag,
        "server_queue": _server_queue,
        "prefill": _prefill,
        "decode": _decode,
        "network": _network,
        "itl_jitter": _jitter,
        "tcp_loss": _tcp_loss,
        "path_rtt": _path_rtt,
        "slow_connect": _slow_connect,
        "ttfc_gap": _ttfc_gap,
    }
)


def _ttft_at_stake(f: Finding, c: _Context) -> float:
    """A rule's e2e time at stake, restated as time to first token."""
    if f.ttft_at_stake_s is not None:
        return f.ttft_at_stake_s
    if not f.stages:
        return f.time_at_stake_s  # a rule that does not say: before the first token
    whole = sum(r.stages.get(s, 0.0) for r in c.reqs for s in f.stages)
    before = sum(r.before_first_token(s) for r in c.reqs for s in f.stages)
    return f.time_at_stake_s * (before / whole if whole > 0 else 1.0)


def _restate(f: Finding, c: _Context) -> Finding:
    """The finding in terms of the context's metric, with its what-if."""
    e2e = f.time_at_stake_s
    ttft = _ttft_at_stake(f, c)
    # a cause that only acts after the first token (slow decoding, jitter) is told in e2e
    metric = "ttft" if c.metric == "ttft" and ttft > 0 else "e2e"
    at_stake, base = (ttft, c.ttft) if metric == "ttft" else (e2e, c.e2e)
    return dataclasses.replace(
        f,
        time_at_stake_s=at_stake,
        metric=metric,
        e2e_at_stake_s=e2e,
        ttft_at_stake_s=ttft if c.metric == "ttft" else f.ttft_at_stake_s,
        baseline_s=base,
        what_if_s=max(0.0, base - at_stake),
    )


def _rank(f: Finding, metric: str) -> tuple[int, float, float]:
    """The metric that matters first, then milliseconds at stake."""
    return (f.metric != metric, -f.time_at_stake_s, -(f.e2e_at_stake_s or 0.0))


def _run(context: _Context, rules: Iterable[str] | None) -> list[Finding]:
    if not context.reqs:
        return []
    chosen = RULES if rules is None else {k: RULES[k] for k in rules}
    found = [_restate(f, context) for rule in chosen.values() if (f := rule(context)) is not None]
    return sorted(found, key=lambda f: _rank(f, context.metric))


def diagnose(
    data: Waterfall | WaterfallSet | Iterable[Waterfall],
    *,
    thresholds: Thresholds | None = None,
    server_alpn: str | None = None,
    rules: Iterable[str] | None = None,
) -> list[Finding]:
    """Findings for one request or many (means per request), most time at stake first.

    Args:
        data: one request, several (every rule can speak), or a ``WaterfallSet`` (the rules
            that need TLS, ALPN, origins or token gaps stay silent: a set keeps only columns).
            Failed requests are left out (a failed request alone gets no finding), and so are
            a set's warm-up requests.
        thresholds: when rules fire (defaults: ``Thresholds()``).
        server_alpn: what the server selects when offered h2
            (``latency_analyzer.capture.alpn.probe_alpn(url)``); lets the HTTP/1.1 rule speak
            about requests that all used HTTP/1.1.
        rules: ids from ``RULES`` to run (default: all).
    """
    if isinstance(data, WaterfallSet):
        reqs = _from_set(data)
    else:
        wfs = [data] if isinstance(data, Waterfall) else data
        reqs = [_from_waterfall(wf) for wf in wfs if wf.ok]
    single = len(reqs) == 1
    return _run(_Context(reqs, thresholds or Thresholds(), single, server_alpn), rules)


def what_if(
    data: Waterfall | Iterable[Waterfall],
    findings: Sequence[Finding],
    *,
    rules: Iterable[str] | None = None,
) -> WhatIf:
    """The metric the requests would have had with several remedies at once.

    Each request's own stages named by the chosen findings are removed (a stage named by two
    findings counts once), so the answer is the requests' TTFT (streams) or e2e without them.

    Args:
        data: the request, or the requests the findings came from.
        findings: from :func:`diagnose`.
        rules: the findings to apply, by rule id (default: ``CLIENT_REMEDIES``, the remedies
            that remove their stages outright).
    """
    wfs = [data] if isinstance(data, Waterfall) else list(data)
    context = _Context([_from_waterfall(wf) for wf in wfs if wf.ok], Thresholds(), True, None)
    allowed = CLIENT_REMEDIES if rules is None else frozenset(rules)
    chosen = [f for f in findings if f.rule in allowed and f.stages]
    named = set(s for f in chosen for s in f.stages)
    order = {name: i for i, name in enumerate(CLIENT_STAGES)}
    stages = tuple(sorted(named, key=lambda s: (order.get(s, len(order)), s)))  # path order
    if not context.reqs:
        return WhatIf("e2e", 0.0, 0.0, (), ())
    if context.metric == "ttft":
        then = context.mean(
            lambda r: (
                None if r.ttft is None else r.ttft - sum(r.before_first_token(s) for s in stages)
            )
        )
    else:
        then = context.mean(lambda r: r.e2e - sum(r.stages.get(s, 0.0) for s in stages))
    present = tuple(s for s in stages if any(r.stages.get(s, 0.0) > 0 for r in context.reqs))
    rule_ids = tuple(dict.fromkeys(f.rule for f in chosen))
    return WhatIf(context.metric, context.base, max(0.0, then), rule_ids, present)
