"""Secrets never leave: what ``latency_analyzer._redact`` removes, and a property test that
random secrets, put everywhere a user can put them and echoed back by a hostile server, reach
none of the library's outputs (errors, reprs, summaries, every export, run files, logs, CLI,
pytest report)."""

from __future__ import annotations

import base64
import json
import logging
import secrets
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import latency_analyzer as la
from latency_analyzer import _redact
from latency_analyzer.cli import main
from latency_analyzer.report import (
    render_waterfall,
    to_chrome_trace,
    to_csv,
    to_har,
    to_otlp_json,
    waterfall_html,
    write_jsonl,
)
from latency_analyzer.testing.hostile_server import HostileServer

pytest_plugins = ["pytester"]

PATHS = ("/echo/401", "/echo/500", "/invalid", "/sse-echo", "/ok")


# --- the documented list -------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "Proxy-Authorization",
        "api-key",
        "X-API-Key",
        "Cookie",
        "Set-Cookie",
        "X-Auth-Token",
        "x-goog-api-key",
        "X-Client-Secret",
        "http.authorization",
        "x-session-token",
        "accessToken",
        "refresh_token",
    ],
)
def test_secret_header_names(name: str) -> None:
    assert _redact.is_secret_name(name)
    assert _redact.redact_headers({name: "v"}) == {name: "***"}


@pytest.mark.parametrize(
    "name",
    [
        "Content-Type",
        "x-prompt-tokens",
        "x-generated-tokens",
        "x-time-per-token",
        "usage_output_tokens_claimed",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "llm.token_count.prompt",
        "detokenize",
    ],
)
def test_token_counts_and_ordinary_headers_are_not_secret(name: str) -> None:
    assert not _redact.is_secret_name(name)


@pytest.mark.parametrize(
    "key",
    [
        "key",
        "API_KEY",
        "apikey",
        "token",
        "access_token",
        "password",
        "passwd",
        "secret",
        "client_secret",
        "signature",
        "sig",
        "X-Amz-Signature",
        "X-Amz-Credential",
    ],
)
def test_secret_query_keys_are_masked_and_the_rest_kept(key: str) -> None:
    url = f"https://h/p?n=1&{key}=s3cr3t&flag="
    assert _redact.redact_url(url) == f"https://h/p?n=1&{key}=***&flag="


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GET https://bob:pw@h/x failed", "GET https://***@h/x failed"),
        ("URL('http://h/?api_key=abc&n=1')", "URL('http://h/?api_key=***&n=1')"),
        ("Authorization: Bearer abcdef123456", "Authorization: ***"),
        ('{"x-api-key": "abc123"}', '{"x-api-key": "***"}'),
        ("password=hunter2 rejected", "password=*** rejected"),
        ("key sk-proj-abcdefgh1234 refused", "key *** refused"),
        ("jwt eyJhbGciOi.eyJzdWIiOi.sig-nature_ here", "jwt *** here"),
        ("AKIAABCDEFGHIJKLMNOP leaked", "*** leaked"),
        ("expected a string key: line 1 column 2", "expected a string key: line 1 column 2"),
    ],
)
def test_text_patterns(text: str, expected: str) -> None:
    assert _redact.redact_text(text) == expected


def test_the_values_a_request_carried_are_masked_wherever_they_are_echoed() -> None:
    _redact.remember_request(
        "http://ann:Pa55word-x@h/?sig=Q-value-1234&n=1",
        {"Authorization": "Bearer Tok3n-value-99", "X-Thing-Key": "k3y-value-abc"},
    )
    echoed = "Tok3n-value-99 Q-value-1234 k3y-value-abc Pa55word-x"
    basic = base64.b64encode(b"ann:Pa55word-x").decode()
    assert _redact.redact_text(f"{echoed} {basic}") == "*** *** *** *** ***"
    assert _redact.redact_text("Q-value%2D1234".replace("%2D", "-")) == "***"


def test_short_values_are_not_searched_for_in_free_text() -> None:
    _redact.remember_request("http://h/?token=abc", {"X-Api-Key": "abc"})
    assert _redact.redact_text("a cab abc") == "a cab abc"
    assert _redact.redact_url("http://h/?token=abc") == "http://h/?token=***"


# --- the property: random secrets, every place, every output --------------------------------
@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    with HostileServer().run_in_thread() as server:
        yield server


# a secret can never be ordinary output: a non-hex letter, digits, then random characters
SECRET = st.from_regex(r"[G-Z][a-z]{3}[0-9]{2}[A-Za-z0-9_~-]{6,24}", fullmatch=True)
NAME_PART = st.sampled_from(["Key", "Token", "Secret", "Auth", "Api-Key", "Session-Token"])
QUERY_KEY = st.sampled_from(
    sorted(_redact.SECRET_QUERY_KEYS - {"code", "password", "client_secret"})
)


@st.composite
def placements(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, str], str, list[str]]:
    """Secret headers, secret query parameters, a userinfo, and every secret in them."""
    values = draw(st.lists(SECRET, min_size=9, max_size=9, unique=True))
    custom = f"X-Custom-{draw(NAME_PART)}"
    headers = {
        "Authorization": f"Bearer {values[0]}",
        "X-Api-Key": values[1],
        "api-key": values[2],
        "Cookie": f"session={values[3]}",
        custom: values[4],
    }
    query = {draw(QUERY_KEY): values[5], "password": values[6], "client_secret": values[7]}
    userinfo = f"user{values[8][:3]}:{values[8]}"
    return headers, query, userinfo, values


def _outputs(wf: la.Waterfall, tmp: Path) -> list[str]:
    """Every form in which the library shows or writes one waterfall."""
    out = [str(wf.error), repr(wf), json.dumps(wf.summary()), json.dumps(wf.to_dict())]
    try:
        wf.raise_for_error()
    except la.RequestError as exc:
        out += [str(exc), repr(exc), exc.message]
    out += [render_waterfall(wf), waterfall_html(wf)]
    out += [json.dumps(to_har([wf])), json.dumps(to_otlp_json([wf]))]
    out += [json.dumps(to_chrome_trace([wf])), to_csv([wf])]
    out.append(write_jsonl([wf], tmp / "x.jsonl").read_text())
    return out


def _leaks(texts: list[str], values: list[str]) -> list[tuple[str, str]]:
    return [(v, t[:200]) for t in texts for v in values if v in t]


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(placed=placements())
def test_no_output_holds_a_secret(
    placed: tuple[dict[str, str], dict[str, str], str, list[str]],
    hostile: HostileServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    headers, query, userinfo, values = placed
    caplog.set_level(logging.DEBUG)
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    base = hostile.url.replace("http://", f"http://{userinfo}@")
    # aiohttp sends userinfo as an Authorization header: a request carries one or the other
    without_auth = {k: v for k, v in headers.items() if k != "Authorization"}
    texts: list[str] = []
    seen_before = len(hostile.requests)
    for i, path in enumerate(PATHS):
        target = f"{base}{path}?{qs}" if i % 2 else f"{hostile.url}{path}?{qs}"
        wf = la.probe(target, headers=without_auth if i % 2 else headers, timeout=5)
        assert (wf.error_type is None) == (path == "/ok"), (path, wf.error_type, wf.error)
        texts += _outputs(wf, tmp_path)
    args = [arg for name, value in headers.items() for arg in ("-H", f"{name}: {value}")]
    for path in ("/invalid", "/echo/401"):
        assert main(["probe", f"{hostile.url}{path}?{qs}", "--json", *args]) == 1
        assert main(["probe", f"{hostile.url}{path}?{qs}", *args]) == 1
    out, err = capsys.readouterr()
    texts += [out, err, caplog.text]
    # the server did receive every secret: the test would prove nothing otherwise
    received = json.dumps([r.__dict__ for r in hostile.requests[seen_before:]])
    assert all(v in received for v in values[:8])
    assert base64.b64encode(userinfo.encode()).decode() in received
    assert _leaks(texts, values) == []


def test_load_run_file_holds_no_secret(hostile: HostileServer, tmp_path: Path) -> None:
    key, password, header = (f"Zz{i}{secrets.token_urlsafe(12)}" for i in range(3))
    url = hostile.url.replace("http://", f"http://bob:{password}@") + f"/echo/401?api_key={key}"
    scenario = la.load.Scenario(url, requests=3, stream=False)
    path = tmp_path / "run.jsonl"
    result = la.load.run_sync(scenario, path=path, headers={"X-Api-Key": header}, rtt_samples=0)
    assert result.set is not None
    text = path.read_text()
    assert "api_key=***" in text  # the header line still names the target
    assert _leaks([text], [key, password, header]) == []


def test_pytest_report_holds_no_secret(
    pytester: pytest.Pytester, hostile: HostileServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"Zz9{secrets.token_urlsafe(16)}"
    pytester.makepyfile(
        test_inner=textwrap.dedent(
            """
            import os
            import pytest

            @pytest.mark.latency_budget(e2e="1s")
            def test_secret(latency):
                url = os.environ["HOSTILE_URL"] + "/invalid?api_key=" + os.environ["HOSTILE_KEY"]
                latency.probe(url, headers={"X-Api-Key": os.environ["HOSTILE_KEY"]})
            """
        )
    )
    # in the environment, not the test's source: pytest may print the source of a failure
    monkeypatch.setenv("HOSTILE_URL", hostile.url)
    monkeypatch.setenv("HOSTILE_KEY", key)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    text = result.stdout.str() + result.stderr.str()
    assert "requests failed" in text, text  # the report did list the failed request
    assert key not in text


async def test_scrape_failures_hold_no_secret() -> None:
    from latency_analyzer.metrics import Scraper

    key = f"Zz8{secrets.token_urlsafe(12)}"
    async with HostileServer() as server:
        target = f"{server.url}/invalid?api_key={key}"
        async with Scraper(target, interval=0.1) as scraper:
            pass  # stopping scrapes every target once more, awaited: the gap is recorded
    gaps = scraper.series.gaps
    assert gaps, "the invalid response was not recorded as a gap"
    assert _leaks([repr(gaps), repr(scraper.series.targets)], [key]) == []
