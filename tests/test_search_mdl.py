"""``latency-analyzer search`` finds the rate an M/D/1 queue's formula gives for a mean-latency
SLO, within 10 %.

The queue: the test bed's LLM server with one slot (``slots=1``: one request served at a time,
the others wait in arrival order) and a fixed service time S (``prefill``, one token, not
streamed), fed by the open-loop client's Poisson arrivals: M/D/1. Its mean wait is
``Wq = ρ·S / (2(1 − ρ))`` (Pollaczek–Khinchine with a deterministic service), ρ = λ·S.

The SLO is on the mean end-to-end latency the client measures, ``e2e_mean <= L``: the client
sees ``c + Wq + S``, where c is what the client and the loopback add around the server's own
sojourn. Solving ``c + S + ρS / (2(1 − ρ)) = L`` for the allowed wait ``w = L − c − S`` gives
``ρ = 2w / (S + 2w)`` and the formula's rate ``λ = ρ / S``. S and c are measured, not assumed,
probe by probe: S is the mean of the server's own service times (its log: slot acquired to
response sent) plus its mean hand-over to a waiting request (the busy time between one
response's end and the next service's start, about 0.1 ms), c the mean of client e2e minus
server sojourn. They are taken per probe because a virtual machine's pace drifts within one
run, quiet host or not: seen here, c 0.5 ms in one run and 1.1-1.9 ms from probe to probe
of another, S 6.25 ms and 6.6-6.9 ms. The formula's rate is therefore a range, one value per
deciding probe (the last passing and the first failing), and the answer must lie within
10 % of it. (P95 of M/D/1 has no closed form, so a mean SLO keeps the formula exact.)

Why 10 % holds, and the tolerance budget:

* Arrivals: the scenario's seed fixes the exponential draws, and every probe uses the same
  draws scaled by 1/rate (the test checks this on the run file), so all probes see one
  Poisson realisation: its mean latency is monotone in the rate and bisection converges on
  that realisation's threshold. How far that threshold lies from the formula's (N → ∞) rate
  is computed here exactly, by the Lindley recursion ``W(n+1) = max(0, W(n) + S − A(n+1))``
  on the run file's own arrival instants (S the probe's logged service, request by request),
  and printed with the result (seed 0, 300 requests: about +5 %). That offset is luck of the
  seed, not precision: over random seeds it spreads with a standard deviation of about 9 % at
  300 requests and ρ = 0.75 (a simulation of 200 seeds), and a check within 10 % at 3 σ for
  *any* seed would need some 2,000 requests per probe (the spread falls as 1/√N), minutes of
  test. So the test holds the search to two
  things: the formula's rate within 10 % (the target, for this fixed realisation), and,
  the part a seed cannot excuse, every probe's verdict: a probe that met the SLO ran at most
  the jitter below over the realisation's threshold under that probe's own S and c, and one
  that failed at most the jitter under it.
* Resolution: the rate reported is the last passing one, at most ``RESOLUTION`` (3 %) under
  the first failing one.
* Jitter: server and client run at real-time priority (the server child asks for it; the
  ``realtime`` fixture moves this process), so ordinary host load cannot stretch S or c
  (a host's own drift is measured per probe, above). What is left within one probe, a
  service stalled by tens of ms now and then and c changing by a fraction of a ms, moves
  the threshold by about (H/S)²·(1 − ρ)/N and 2(1 − ρ)²·Δc/(S·ρ), 1–2 % each at
  H = 25 ms, Δc = 0.5 ms: ``JITTER`` = 5 % is about twice their sum. Longer
  stalls are kept out at their source: the runner and the server child keep the garbage
  collector off what existed before (a full collection had stopped either loop for 20–70 ms,
  seen as a probe 3–5 % too low), and a probe that fails while the client's self-check says it
  lagged is run again by the search.
* Size: S = 6 ms rather than less, because a stall's effect grows as (H/S)²; the test takes
  about 20 s (seven probes of 300 requests) and is marked slow.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from wire_bounds import Steal

from latency_analyzer.analysis import WaterfallSet
from latency_analyzer.cli import main
from latency_analyzer.testing import LLMServer, RequestRecord

S_NOMINAL = 0.006  # seconds of service per request
SLO_MS = 16.0  # mean e2e the search must meet: with c ~ 1 ms, about rho = 0.75
REQUESTS, WARMUP = 300, 30  # per probe: the first 30 (an empty queue filling) are left out
RESOLUTION = 0.03
JITTER = 0.05  # host hiccups and client overhead that varies between probes (see above)


def _formula_rate(slo_s: float, s: float, c: float) -> float:
    """M/D/1: the rate whose mean latency c + S + rho*S/(2(1 - rho)) equals the SLO."""
    w = slo_s - c - s
    rho = 2 * w / (s + 2 * w)
    return rho / s


def _lindley_rate(unit_arrivals: np.ndarray, slo_s: float, s: np.ndarray, c: float) -> float:
    """The rate at which this realisation's mean latency (after the warm-up) meets the SLO,
    customer ``n`` served for ``s[n]``: a probe's own service times, as its server logged
    them in arrival order, stalls and all (a constant S would leave out the wait those
    stalls add, which M/D/1 does not have)."""
    assert len(s) == len(unit_arrivals)
    mean_s = float(s.mean())

    def mean_latency(rate: float) -> float:
        t = unit_arrivals / rate
        wait, total = 0.0, 0.0
        for n in range(1, len(t)):
            wait = max(0.0, wait + s[n - 1] - (t[n] - t[n - 1]))
            if n >= WARMUP:
                total += wait
        return c + float(s[WARMUP:].mean()) + total / (len(t) - WARMUP)

    lo, hi = 0.1 / mean_s, 1.0 / mean_s
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_latency(mid) <= slo_s else (lo, mid)
    return lo


def _ms(condition: tuple[float, np.ndarray]) -> tuple[float, float]:
    """A probe's S and c in milliseconds, for the report."""
    c, each = condition
    return round(float(each.mean()) * 1e3, 3), round(c * 1e3, 3)


def _handoff_s(records: list[RequestRecord]) -> float:
    """The server's mean time between one service's end and the next's start when a request
    was already waiting: busy time outside the recorded service (about 0.1 ms)."""
    served = sorted(records, key=lambda r: r.received_ns)
    gaps = [
        b.received_ns - a.end_ns
        for a, b in itertools.pairwise(served)
        if b.received_ns - b.slot_wait_ns < a.end_ns  # b arrived while a was being served
    ]
    return float(np.mean(gaps)) / 1e9 if gaps else 0.0


def _conditions_by_step(
    ws: WaterfallSet, records: list[RequestRecord]
) -> dict[int, tuple[float, np.ndarray]]:
    """Per probe (probes run one after another): c, the mean client e2e minus the mean
    server sojourn, and each request's own service plus the server's mean hand-over, in
    arrival order (their mean is the probe's S)."""
    out = {}
    for step, group in ws.group_by("step").items():
        start = group.column("start_ns")
        lo, hi = int(start.min()), int((start + group.column("e2e_ns")).max())
        inside = [r for r in records if lo <= r.received_ns - r.slot_wait_ns <= hi]
        assert len(inside) == len(group), step
        handoff = _handoff_s(inside)
        arrived = sorted(inside, key=lambda r: r.received_ns - r.slot_wait_ns)
        each = np.array([r.end_ns - r.received_ns for r in arrived]) / 1e9 + handoff
        sojourn = np.mean([r.end_ns - r.received_ns + r.slot_wait_ns for r in inside]) / 1e9
        c = float(np.mean(group.column("e2e_ns")) / 1e9 - sojourn)
        out[step] = (c, each)
    return out


@pytest.mark.usefixtures("realtime")
def test_search_finds_the_md1_rate_within_10_percent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "search.jsonl"
    rate_max = 0.95 / S_NOMINAL  # just under the server's capacity: fails by far
    with LLMServer(prefill=S_NOMINAL, tokens=1, slots=1).run_in_subprocess() as server:
        argv = [
            "search",
            "--url",
            server.url + "/v1/chat/completions",
            "--slo",
            f"e2e_mean={SLO_MS}ms",
            "--rate-max",
            f"{rate_max}",
            "--resolution",
            f"{RESOLUTION:.0%}",
            "--arrival",
            "poisson",
            "--requests",
            str(REQUESTS),
            "--warmup-requests",
            str(WARMUP),
            "--body-extra",
            '{"stream": false}',
            "--out",
            str(out),
            "--json",
        ]
        with Steal() as steal:
            code = main(argv)
        records = server.records
    found = json.loads(capsys.readouterr().out)
    assert code == 0 and found["rate"] is not None and found["failing"] is not None

    ws = WaterfallSet.load(out)
    steps = ws.group_by("step")
    assert len(steps) == len(found["points"]) and len(records) == len(ws)
    # one Poisson realisation for every probe: the same draws, scaled by 1/rate
    unit = {}
    for point in found["points"]:
        start = np.sort(steps[point["step"]].column("start_ns").astype(float))
        unit[point["step"]] = (start - start[0]) / 1e9 * point["rate"]
    for arrivals in unit.values():
        np.testing.assert_allclose(arrivals, unit[0], rtol=1e-6, atol=1e-6)

    service = np.array([r.end_ns - r.received_ns for r in records]) / 1e9
    conditions = _conditions_by_step(ws, records)
    slo, rate = SLO_MS / 1e3, found["rate"]
    # this realisation's threshold and the formula's rate under each probe's own S and c
    own = {k: _lindley_rate(unit[0], slo, each, c) for k, (c, each) in conditions.items()}
    formula = {k: _formula_rate(slo, float(each.mean()), c) for k, (c, each) in conditions.items()}
    deciding = [found["passing"]["step"], found["failing"]["step"]]
    probes = [(round(p["rate"], 1), p["met"], *_ms(conditions[p["step"]])) for p in found["points"]]
    report = (
        f"search {rate:.1f} req/s; under the deciding probes' S and c: formula "
        f"{[round(formula[k], 1) for k in deciding]}, this seed's Lindley threshold "
        f"{[round(own[k], 1) for k in deciding]}; service CV {service.std() / service.mean():.3f}"
        f"; probes (rate, met, S ms, c ms): {probes}"
    )
    print(report)
    # the service the server was asked for, at the median of those not stretched by a stop
    # of the server's vCPU: one per stolen jiffy is left out, from the top (wire_bounds)
    kept = np.sort(service)[: max(0, len(service) - steal.jiffies)]  # none if steal took all
    assert len(kept) and np.median(kept) < 1.05 * S_NOMINAL, (steal.jiffies, np.median(service))
    # the target: the formula's rate, within 10 %, for the conditions the answer was found in
    lo, hi = min(formula[k] for k in deciding), max(formula[k] for k in deciding)
    assert lo / 1.10 <= rate <= hi * 1.10, report
    # the instrument: every probe's verdict right for this realisation under its own S and c,
    # within the jitter; the answer within the resolution of the failing probe
    for point in found["points"]:
        threshold = own[point["step"]]
        if point["met"]:
            assert point["rate"] <= threshold * (1 + JITTER), (point, report)
        else:
            assert point["rate"] >= threshold / (1 + JITTER), (point, report)
    assert found["failing"]["rate"] <= rate * (1 + RESOLUTION) * 1.0001, report
