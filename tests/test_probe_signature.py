"""``probe`` spells out ``aprobe``'s parameters, so type checkers and IDEs check its calls."""

from __future__ import annotations

import inspect

import latency_analyzer as la
from latency_analyzer.capture import client


def test_probe_takes_exactly_the_parameters_of_aprobe() -> None:
    sync, coro = inspect.signature(client.probe), inspect.signature(client.aprobe)
    assert list(sync.parameters.values()) == list(coro.parameters.values())
    assert sync.return_annotation == coro.return_annotation == "Waterfall"
    # the public names are the same functions
    assert (la.probe, la.aprobe) == (client.probe, client.aprobe)


def test_the_signature_check_sees_a_difference() -> None:
    """The comparison above is strict: a renamed, retyped or re-defaulted keyword fails it."""
    coro = inspect.signature(client.aprobe)
    params = list(coro.parameters.values())
    timeout = coro.parameters["timeout"]
    for changed in (
        timeout.replace(name="time_limit"),
        timeout.replace(annotation="int"),
        timeout.replace(default=30.0),
    ):
        altered = [changed if p is timeout else p for p in params]
        assert altered != params
