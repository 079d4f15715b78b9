"""Locust user classes whose requests go through our capture engine and return waterfalls.

Importing this module (which ``from latency_analyzer.locust import LatencyUser`` does)
registers the plugin on Locust's global events: the ``--la-*`` options, the ``request``
events with stage rows, the run file, the distributed-mode report channel and the web UI page.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import urlsplit

from locust import User, events

from ..errors import UsageError
from ..timeline import Waterfall
from ._bridge import EngineProcess
from ._run import DEFAULT_STAGES, LocustRun, exit_usage, parse_stages

__all__ = ["LatencyClient", "LatencyUser", "OpenAIUser", "run_of"]

_RUNS: weakref.WeakKeyDictionary[Any, LocustRun] = weakref.WeakKeyDictionary()


def run_of(environment: Any) -> LocustRun:
    """The plugin's state for ``environment`` (made at ``init``, or on first use)."""
    run = _RUNS.get(environment)
    if run is None:
        opts = environment.parsed_options
        stages = getattr(opts, "la_stages", None)  # "" adds no rows
        run = LocustRun(
            environment,
            out=getattr(opts, "la_out", None),
            stages=DEFAULT_STAGES if stages is None else parse_stages(stages),
            drain_s=float(getattr(opts, "la_drain", 10.0) or 10.0),
        )
        _RUNS[environment] = run
    return run


class LatencyClient:
    """A Locust user's HTTP client: every request is captured and returns its ``Waterfall``.

    Failed requests come back as waterfalls too (``wf.error``, ``wf.error_type``); nothing is
    raised for network or HTTP errors. Each request fires Locust's ``request`` event with
    ``response_time`` = e2e in ms, plus one row per chosen stage (``--la-stages``).

    Args:
        engine: the process's capture engine.
        base_url: prefix of relative paths (the user's ``host``).
        options: ``Client`` options of this user's connection pool (``http2``, ``limit``,
            ``keepalive``, ``insecure``, ``timeout``, ``dns_timeout``, ``resolver``).
        headers: sent with every request; never recorded.
        context: called for the request event's ``context`` (the user's ``context()``).
    """

    def __init__(
        self,
        engine: EngineProcess,
        base_url: str | None,
        *,
        options: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        context: Any = None,
    ) -> None:
        self.engine, self.base_url = engine, base_url
        self.headers = dict(headers or {})
        self._context = context
        self._user = engine.open_user(options or {})

    def request(
        self,
        method: str,
        path: str,
        *,
        name: str | None = None,
        json: Any = None,
        data: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        prompt_tokens: int = -1,
        request_type: str | None = None,
    ) -> Waterfall:
        """Send one request; its waterfall (also in Locust's statistics and our run file).

        Args:
            method: HTTP method.
            path: a path under ``base_url`` or a full URL.
            name: the row's name in Locust's statistics (default: the path).
            json, data: the body.
            headers: this request's headers (merged over the client's).
            timeout: seconds for the whole request (default: the pool's).
            prompt_tokens: the prompt's length, kept as the row's ``prompt_tokens`` tag.
            request_type: Locust's request type column (default: the method).

        Raises:
            UsageError: not an http(s) URL, or no ``host``.
        """
        url = self._url(path)
        spec = {"url": url, "method": method, "json": json, "data": data, "timeout": timeout}
        spec["headers"] = {**self.headers, **(headers or {})}
        context = self._context() if callable(self._context) else (self._context or {})
        meta = {
            "name": name or urlsplit(url).path or "/",
            "context": context,
            "prompt_tokens": prompt_tokens,
            "request_type": request_type,
        }
        return self.engine.request(self._user, spec, meta)

    def get(self, path: str, **kwargs: Any) -> Waterfall:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Waterfall:
        return self.request("POST", path, **kwargs)

    def close(self) -> None:
        """Close this user's connections (the engine keeps serving other users)."""
        self.engine.close_user(self._user)

    def _url(self, path: str) -> str:
        if "://" in path:
            return path
        if not self.base_url:
            raise UsageError("no host: set the user's host or pass --host / -H")
        return self.base_url.rstrip("/") + "/" + path.lstrip("/")


class LatencyUser(User):
    """A Locust ``User`` whose ``self.client`` is a :class:`LatencyClient`.

    Class attributes:
        client_options: ``Client`` options of each user's own connection pool
            (``{"http2": True}``, ``{"keepalive": False}``, ``{"insecure": True}`` ...).
        headers: sent with every request of this user (never recorded).

    Think time (``wait_time``) and tasks (``@task`` weights) are Locust's own.
    """

    abstract = True
    client_options: ClassVar[Mapping[str, Any]] = {}
    headers: ClassVar[Mapping[str, str]] = {}

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        engine = run_of(environment).engine_for_users()
        self.client = LatencyClient(
            engine,
            self.host,
            options=self.client_options,
            headers=self.headers,
            context=self.context,
        )

    def on_stop(self) -> None:
        self.client.close()


class OpenAIUser(LatencyUser):
    """An OpenAI-compatible endpoint's user: ``chat(...)`` and ``completions(...)``, streamed.

    Class attributes:
        model: the ``model`` field of every request.
        api_key: sent as ``Authorization: Bearer ...`` (never recorded) when set.
        max_tokens: default output length (None: the server's).
    """

    abstract = True
    model: ClassVar[str] = "default"
    api_key: ClassVar[str | None] = None
    max_tokens: ClassVar[int | None] = None

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        if self.api_key:
            self.client.headers["Authorization"] = f"Bearer {self.api_key}"

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        *,
        name: str = "chat",
        stream: bool = True,
        max_tokens: int | None = None,
        **body: Any,
    ) -> Waterfall:
        """POST ``/v1/chat/completions``; a string is one user message.

        ``body`` adds or overrides request fields (``temperature=0``, ``model=...``).
        """
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        payload = {"model": self.model, "messages": list(messages)}
        prompt = " ".join(str(m.get("content", "")) for m in messages)
        return self._send("/v1/chat/completions", payload, name, stream, max_tokens, prompt, body)

    def completions(
        self,
        prompt: str,
        *,
        name: str = "completions",
        stream: bool = True,
        max_tokens: int | None = None,
        **body: Any,
    ) -> Waterfall:
        """POST ``/v1/completions`` with ``prompt``."""
        payload: dict[str, Any] = {"model": self.model, "prompt": prompt}
        return self._send("/v1/completions", payload, name, stream, max_tokens, prompt, body)

    def _send(
        self,
        path: str,
        payload: dict[str, Any],
        name: str,
        stream: bool,
        max_tokens: int | None,
        prompt: str,
        body: Mapping[str, Any],
    ) -> Waterfall:
        payload["stream"] = stream
        if stream:
            payload["stream_options"] = {"include_usage": True}
        tokens = max_tokens if max_tokens is not None else self.max_tokens
        if tokens is not None:
            payload["max_tokens"] = tokens
        payload.update(body)
        words = len(prompt.split())  # the prompt's length in words, the test bed's tokens
        return self.client.post(path, json=payload, name=name, prompt_tokens=words)


# -- the plugin's hooks on Locust's global events --------------------------------------------
def _options(parser: Any) -> None:
    group = parser.add_argument_group("latency_analyzer")
    group.add_argument(
        "--la-out",
        default="waterfalls.jsonl",
        metavar="FILE",
        help="every waterfall as a latency_analyzer run file (local/master). Default: %(default)r",
    )
    group.add_argument(
        "--la-stages",
        default=",".join(DEFAULT_STAGES),
        metavar="LIST",
        help="stages and metrics shown as their own rows in Locust's statistics. "
        "Default: %(default)r",
    )
    group.add_argument(
        "--la-drain",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="at stop, wait this long for requests in flight. Default: %(default)r",
    )


def _init(environment: Any, runner: Any = None, web_ui: Any = None, **_: Any) -> None:
    try:
        run = run_of(environment)
    except ValueError as exc:
        exit_usage(f"--la-stages: {exc}")
        return
    if run.role == "worker":
        environment.events.report_to_master.add_listener(
            lambda client_id, data: run.on_report_to_master(data)
        )
        runner.register_message("la_clock", lambda environment, msg: run.on_clock_probe(msg))
    if run.role == "master":
        environment.events.worker_report.add_listener(run.on_worker_report)
        runner.register_message("la_clock_back", lambda environment, msg: run.on_clock_back(msg))
    if run.role != "master":
        run.engine_for_users()  # starting while Locust starts: the first users need not wait
    environment.events.test_start.add_listener(lambda **kw: run.on_test_start())
    environment.events.test_stop.add_listener(lambda **kw: run.on_test_stop())
    environment.events.quit.add_listener(lambda **kw: run.on_quit())
    if web_ui is not None:
        from ._web import add_page

        add_page(web_ui, run)


_events: Any = events  # Locust's EventHook.add_listener is untyped
_events.init_command_line_parser.add_listener(_options)
_events.init.add_listener(_init)
