"""Locust users that get waterfalls: ``pip install 'latency-analyzer[locust]'``.

::

    from locust import between, task
    from latency_analyzer.locust import OpenAIUser

    class Chat(OpenAIUser):
        wait_time = between(1, 3)
        model = "my-model"

        @task
        def short(self):
            wf = self.chat("Say hello", max_tokens=32)   # a Waterfall, failed or not

Each request goes through the capture engine (a child process on plain asyncio, away from
gevent), fires Locust's ``request`` event (e2e), adds TTFT / TPOT / stage rows to Locust's
statistics, and is kept in a run file (``--la-out``) that ``WaterfallSet.load`` and
``latency-analyzer compare`` read. The web UI gains ``/latency``. See docs/locust.md.

Locust (and gevent's monkey-patching with it) loads only when a name below is first used:
the engine process imports this package without them.
"""

import typing

if typing.TYPE_CHECKING:
    from ._run import WaterfallFailed
    from ._user import LatencyClient, LatencyUser, OpenAIUser

__all__ = ["LatencyClient", "LatencyUser", "OpenAIUser", "WaterfallFailed"]


def __getattr__(name: str) -> object:
    if name in __all__:
        try:
            from . import _user
        except ImportError as exc:
            if exc.name not in ("locust", "gevent"):
                raise
            from ..errors import UsageError

            raise UsageError(
                "latency_analyzer.locust needs Locust: pip install 'latency-analyzer[locust]'"
            ) from None
        if name == "WaterfallFailed":
            from ._run import WaterfallFailed

            return WaterfallFailed
        return getattr(_user, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
