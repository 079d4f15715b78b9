"""Acceptance: a Poisson open loop against one deterministic server slot is an M/D/1 queue.

The mean wait of M/D/1 is ρ / (2μ(1 − ρ)). At ρ = 0.8 its sample mean converges slowly
(waits are strongly autocorrelated): over 600 requests the raw sample mean scatters by about
±30% around the formula, whatever the client does. So the check is split in two:

1. the runner's Poisson arrivals fed through the exact queue recursion (Lindley:
   ``W[n+1] = max(0, W[n] + D - A[n+1])``) give the formula's mean wait over 400,000
   arrivals (pure computation, seeded);
2. in a live run, the wait the client measured from each request's *intended* start equals
   the wait that same recursion predicts for the run's own arrival instants and the server's
   own service times. As a control-variate estimate of the formula's mean,
   ``W_measured - (W_recursion - W_formula)`` must lie within 10% of ``W_formula``. The
   recursion counts the time each request really held the slot (a stalled server process on a
   busy 2-core machine serves slower than D).

Service D = 10 ms (header_delay) plus the server's own per-request work, measured from its
records; the rate is set so that ρ = λ·D = 0.8 exactly for the measured D. The client's own
share of each latency (its work and loopback, besides the queue and the service) comes from the
same run, not the calibration: the mean latency beyond the run's service and the predicted wait
of the requests the recursion says found the slot free or nearly (under 1 ms). A busy host
(steal in a virtual machine) moves service and overhead between a calibration and the run by
more than the tolerance; the queued requests must carry the same share as the free ones.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from latency_analyzer.load import Scenario, arrival_gaps, run
from latency_analyzer.load._monitor import OWN_CPU_LIMIT
from latency_analyzer.testing import LLMServer, RequestRecord

CHAT = "/v1/chat/completions"
RHO = 0.8
REQUESTS = 600
WARMUP = 60


def lindley(arrivals_s: np.ndarray, service_s: np.ndarray) -> np.ndarray:
    """Queueing wait of each customer of a FIFO single server (arrivals sorted)."""
    wait = np.zeros(len(arrivals_s))
    for i in range(1, len(arrivals_s)):
        gap = arrivals_s[i] - arrivals_s[i - 1]
        wait[i] = max(0.0, wait[i - 1] + service_s[i - 1] - gap)
    return wait


def slot_held(served: list[RequestRecord]) -> np.ndarray:
    """Seconds each request held the server's slot: until the next one got it when that one
    was waiting (so a stall of the server process counts as service), else its own span."""
    held = np.array([(r.end_ns - r.received_ns) / 1e9 for r in served])
    for i in range(len(served) - 1):
        if served[i + 1].slot_wait_ns > 0:
            held[i] = (served[i + 1].received_ns - served[i].received_ns) / 1e9
    return held


def md1_wait(rho: float, service_s: float) -> float:
    return rho / (2 * (1 / service_s) * (1 - rho))


def test_the_runners_poisson_arrivals_make_an_md1_queue() -> None:
    service = 0.005
    gen = arrival_gaps("poisson", RHO / service, random.Random(11))
    arrivals = np.cumsum([next(gen) for _ in range(400_000)])
    wait = lindley(arrivals, np.full(len(arrivals), service))
    assert wait[10_000:].mean() == pytest.approx(md1_wait(RHO, service), rel=0.05)


async def test_poisson_open_loop_at_rho_08_matches_md1() -> None:
    with LLMServer(slots=1, header_delay=0.010, tokens=1).run_in_subprocess() as server:
        url = server.url + CHAT
        calib = await run(Scenario(url, requests=40, stream=False, name="calib"), rtt_samples=0)
        recs = server.records
        service = float(np.mean([r.end_ns - r.received_ns for r in recs[5:]])) / 1e9
        assert len(calib.set) == 40
        sc = Scenario(
            url,
            mode="open",
            rate=RHO / service,
            arrival="poisson",
            requests=REQUESTS,
            warmup_requests=WARMUP,
            stream=False,
            seed=7,
            name="md1",
        )
        seen = len(server.records)
        result = await run(sc, rtt_samples=0)
        recs = server.records[seen:]
    ws = result.set
    assert result.issued == len(ws) == len(recs) == REQUESTS
    assert not result.target_saturated
    # the client was not its own bottleneck: below its CPU limit, and a loop that lagged all
    # the same lagged because other processes took the host's CPUs
    health = result.client
    assert health.cpu < OWN_CPU_LIMIT and (not health.saturated or health.host_contended)

    # A request the pacer issued late (a busy host) reached the queue late: the queue the
    # server saw is that of the instants the requests really left, intended + schedule_lag,
    # as the client recorded each one; the lag itself is the client's, not the queue's.
    order = np.argsort(ws.column("start_ns"))
    lag = ws.column("stage:schedule_lag")[order] / 1e9 if "schedule_lag" in ws.stages else 0.0
    intended = ws.column("start_ns")[order] / 1e9 + lag
    served = sorted(recs, key=lambda r: r.received_ns)
    run_service = float(np.mean([r.end_ns - r.received_ns for r in served])) / 1e9
    raw = (ws.column("e2e_ns")[order] / 1e9 - lag - run_service)[WARMUP:]
    predicted = lindley(intended, slot_held(served))
    predicted = predicted[WARMUP:]
    # found the slot (nearly) free: the latency beyond service and that wait is the client's own
    idle = predicted < 0.001
    assert idle.sum() >= 0.1 * len(idle)  # about 1 - ρ of them
    overhead = float((raw - predicted)[idle].mean())
    measured = raw - overhead
    formula = md1_wait(RHO, service)

    estimate = measured.mean() - (predicted.mean() - formula)
    print(  # the figures, for the report (pytest -s)
        f"D={service * 1e3:.3f} ms (run: {run_service * 1e3:.3f} ms)"
        f" overhead={overhead * 1e3:.3f} ms formula={formula * 1e3:.2f}"
        f" measured={measured.mean() * 1e3:.2f} recursion={predicted.mean() * 1e3:.2f}"
        f" control-variate={estimate * 1e3:.2f} ms"
    )
    assert estimate == pytest.approx(formula, rel=0.10)
    # the server's own slot waits agree with the recursion too (the test bed is M/D/1)
    slot_wait = np.array([r.slot_wait_ns for r in served][WARMUP:]) / 1e9
    assert slot_wait.mean() == pytest.approx(predicted.mean(), rel=0.10)
