"""The state the tasks of one run share: the next request to claim, rows stored, deadlines."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..analysis import Tags, WaterfallSet
from ..capture.client import Client
from ..timeline import Waterfall
from ._datasets import Dataset, Sample, sample_body
from ._lengths import Lengths
from ._scenario import Scenario, Template
from ._trace import TraceRow

__all__ = ["Claim", "Progress", "RowSink", "RunState"]

Progress = Callable[[int, int | None], None]
#: Called with each stored row as it is stored (e.g. to stream it to another process).
RowSink = Callable[[Waterfall, Tags], None]

_WORKER_SHIFT = 1021  # filler words between workers' starting points (a prime: rarely aligned)


@dataclass
class Claim:
    """One request to send: its template, body and what it was built from."""

    template: Template
    body: dict[str, Any]
    length: int = -1  # the prompt's measured length (-1: a bare one-word prompt)
    sample: Sample | None = None  # the dataset row, if any
    tag: str | None = None  # the row (and turn) as stored in the ``sample`` tag


class RunState:
    """State shared by the tasks of one run."""

    def __init__(
        self,
        sc: Scenario,
        ws: WaterfallSet,
        client: Client,
        worker: int,
        step: int,
        progress: Progress | None,
        on_row: RowSink | None = None,
        stop: asyncio.Event | None = None,
        dataset: Dataset | None = None,
        trace: list[TraceRow] | None = None,
        lengths: Lengths | None = None,
    ) -> None:
        self.sc, self.ws, self.client = sc, ws, client
        self.dataset, self.trace = dataset, trace
        self.lengths = lengths or Lengths()
        self.by_name = {t.name: t for t in sc.templates}
        self.on_row, self.stop = on_row, stop
        self.rng = random.Random(sc.seed)
        self.worker, self.step = worker, step
        self.progress = progress
        self.issued = 0
        self.stored = 0
        self.tls_versions: set[str] = set()
        self.t0 = 0
        self.issue_end_ns = 0

    def full(self) -> bool:
        """The count bound is reached."""
        return self.sc.requests is not None and self.issued >= self.sc.requests

    def next_request(self) -> Claim | None:
        """Claim the next request (None once the count bound is reached)."""
        if self.full() or (self.trace is not None and self.issued >= len(self.trace)):
            return None
        self.issued += 1
        if self.trace is not None:
            return self._trace_claim(self.trace[self.issued - 1])
        if self.dataset is None:
            template = self.sc.pick(self.rng)
            if template.prompt_tokens is None:
                text, length = "hi", -1
            else:  # the length drawn, then filler of that many tokens (or words)
                target = max(1, round(template.prompt_tokens.sample(self.rng)))
                text, length = self.lengths.prompt(target, self._offset())
            messages = [{"role": "user", "content": text}]
            body = sample_body(self.sc, template, messages, None, self.rng)
            return Claim(template, body, length)
        s = self.dataset.draw(self.rng)
        if s.klass is None:  # one template: the draw alone consumes the seeded stream
            one = len(self.sc.templates) == 1
            template = self.sc.templates[0] if one else self.sc.pick(self.rng)
        else:  # a class is its template's name; a class without a template gets a bare one
            template = self.by_name.get(s.klass) or Template(name=s.klass)
        body = sample_body(self.sc, template, s.messages, s.max_tokens, self.rng)
        return Claim(template, body, self.lengths.measure(s.messages), s, s.tag)

    def _offset(self) -> int:
        """Where this request's filler starts: its index, and another place per worker, so
        equal lengths from two workers are different texts (no shared prefix to cache)."""
        return self.issued - 1 + self.worker * _WORKER_SHIFT

    def _trace_claim(self, row: TraceRow) -> Claim:
        template = self.sc.templates[0] if len(self.sc.templates) == 1 else self.sc.pick(self.rng)
        text = row.prompt
        if text is None:  # a length only: filler, rotated so prompts differ
            text, length = self.lengths.prompt(row.input_tokens or 1, self._offset())
        else:
            length = self.lengths.count(text)
        messages = [{"role": "user", "content": text}]
        body = sample_body(self.sc, template, messages, row.output_tokens, self.rng)
        return Claim(template, body, length, None, row.tag)

    def next_turn(self, claim: Claim, turn: int, history: list[dict[str, Any]]) -> Claim | None:
        """Claim turn ``turn`` (from 1) of a conversation sent with ``history`` (None once a
        bound is reached)."""
        if self.full() or self.past_deadline(time.perf_counter_ns()):
            return None
        self.issued += 1
        assert claim.sample is not None
        body = sample_body(self.sc, claim.template, history, claim.sample.max_tokens, self.rng)
        length = self.lengths.measure(history)
        return Claim(claim.template, body, length, claim.sample, f"{claim.tag}#{turn}")

    def warm(self, index: int, start_ns: int) -> bool:
        sc = self.sc
        return index < sc.warmup_requests or start_ns < self.t0 + round(sc.warmup_seconds * 1e9)

    def store(self, wf: Waterfall, claim: Claim, warmup: bool) -> None:
        name, length, body = claim.template.name, claim.length, claim.body
        out = body.get("max_tokens", body.get("max_completion_tokens"))
        least = body.get("min_tokens")
        tags = Tags(
            *(self.sc.name, name, length, self.worker, self.step, warmup, claim.tag),
            max_tokens=_count(out),
            min_tokens=_count(least),
        )
        self.ws.add(wf, tags)
        self.stored += 1
        if wf.tls is not None and wf.tls.version:
            self.tls_versions.add(wf.tls.version)
        if self.on_row is not None:
            self.on_row(wf, tags)
        if self.progress is not None:
            self.progress(self.stored, self.sc.requests)

    def past_deadline(self, t_ns: int) -> bool:
        if self.stop is not None and self.stop.is_set():
            return True  # a graceful stop: issue nothing more, let in-flight requests finish
        d = self.sc.duration
        return d is not None and t_ns >= self.t0 + round(d * 1e9)


def _count(value: Any) -> int:
    """A token count a body carries (an int, not a bool), or -1."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return int(value) if ok else -1
