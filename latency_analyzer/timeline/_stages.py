"""The stage vocabulary: budgets, diagnosis, plots and exports all use these names."""

from __future__ import annotations

from typing import Final, Literal

Source = Literal["client", "server", "profile"]

#: Client stages along a request's path, in the order they happen.
CLIENT_STAGES: Final = (
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

#: Client stages that run alongside the ones after them instead of before them: ``h2_setup``
#: waits for the server's SETTINGS while the first request is already sent and answered. Their
#: exclusive time is only the part of their interval that no other stage covers.
BACKGROUND_STAGES: Final = frozenset({"h2_setup"})

#: Children the server's own spans give to ``wait`` / ``first_token`` / ``decode``.
SERVER_STAGES: Final = ("server_queue", "preprocess", "prefill", "decode", "postprocess")

#: Names for time that no stage explains; attribution never drops it.
#: ``other``: inside the request but outside every client stage (client overhead between stages).
#: ``network``: inside a client stage but outside the server spans placed in it.
RESIDUALS: Final = ("network", "other")

#: Metric names (seconds unless a count).
METRICS: Final = ("ttft", "tpot", "itl", "e2e", "input_tokens", "output_tokens")

ROOT_NAME: Final = "request"
