"""``latency-analyzer``: probe and demo, in-process through ``cli.main`` and once as a process.

The server whose delays are checked runs in its own process (``run_in_subprocess``: no GIL
shared with the client; ``perf_counter_ns`` is one clock for both); servers whose timing is not
checked run on a daemon thread of this process. Timing checks allow 3 ms.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import chat_body
from handshakes import handshakes
from wire_bounds import LOOPBACK_NS, Steal, hold_each, read_end_error

import latency_analyzer as la
from latency_analyzer import demo
from latency_analyzer.cli import main
from latency_analyzer.testing import DNSServer, LLMServer, SubprocessLLMServer, TestBed, TestCA
from latency_analyzer.testing.pcap import Flow, PacketCapture, require_tcpdump
from latency_analyzer.testing.tcpdump import TcpDump
from latency_analyzer.timeline import process_anchor

HEADER_DELAY, PREFILL, DECODE, TOKENS = 0.010, 0.030, 0.005, 8
SLACK = 0.003  # seconds: server thread and client share one GIL
DESIGN_KEYS = {"e2e_s", "ttft_s", "tpot_s", "output_tokens", "http_version", "stages", "error"}
CHAT = "/v1/chat/completions"
ANCHOR_SLACK_NS = 50_000  # another process's anchor (perf_counter to epoch) vs the capture's
LLM_KNOBS = {"header_delay": HEADER_DELAY, "prefill": PREFILL, "decode": DECODE, "tokens": TOKENS}


def _one_json(out: str) -> dict[str, Any]:
    """stdout must hold exactly one JSON object, on one line."""
    lines = out.splitlines()
    assert len(lines) == 1, out
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def _check_design_contract(obj: dict[str, Any]) -> None:
    assert obj.keys() >= DESIGN_KEYS
    assert math.isclose(sum(obj["stages"].values()), obj["e2e_s"], rel_tol=0, abs_tol=1e-9)
    assert obj["error"] is None or isinstance(obj["error"], str)


def _closed_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def tls_llm(ca: TestCA) -> Iterator[LLMServer]:
    with LLMServer(ssl=ca.server_context(), tokens=4).run_in_thread() as s:
        yield s


# --- probe --json -------------------------------------------------------------------------


def test_probe_json_is_one_object_with_the_design_keys(
    llm: SubprocessLLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["probe", llm.url + CHAT, "--json", "-d", json.dumps(chat_body())])
    out, err = capsys.readouterr()
    assert status == 0, err
    obj = _one_json(out)
    _check_design_contract(obj)
    assert obj["error"] is None
    assert obj["http_version"] == "1.1"
    assert obj["output_tokens"] == TOKENS
    assert set(obj["stages"]) <= set(la.CLIENT_STAGES) | set(la.RESIDUALS)
    assert err == ""


def test_probe_json_stages_recover_the_injected_delays(
    llm: SubprocessLLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = []
    for _ in range(3):  # the median of three keeps one descheduled run from failing the test
        assert main(["probe", llm.url + CHAT, "--json", "-d", json.dumps(chat_body())]) == 0
        runs.append(_one_json(capsys.readouterr().out))
    for obj in runs:
        stages = obj["stages"]
        # ttft runs from the start: everything before the headers, then the prefill
        before = sum(v for k, v in stages.items() if k not in ("first_token", "decode", "tail"))
        assert abs(obj["ttft_s"] - (before + stages["first_token"])) <= 1e-9
        assert obj["ttft_s"] >= HEADER_DELAY + PREFILL - 0.0005  # plus connect, send, client work

    def median(key: str) -> float:
        return statistics.median(obj["stages"][key] for obj in runs)

    assert abs(median("wait") - HEADER_DELAY) <= SLACK
    assert abs(median("first_token") - PREFILL) <= SLACK
    assert abs(median("decode") - (TOKENS - 1) * DECODE) <= SLACK
    tpot = statistics.median(obj["tpot_s"] for obj in runs)
    assert abs(tpot - DECODE) <= SLACK / (TOKENS - 1)


def test_body_from_file_reaches_the_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body_file = tmp_path / "body.json"
    body_file.write_text(
        json.dumps({**chat_body(content="where did the time go"), "max_tokens": 5}),
        encoding="utf-8",
    )
    with LLMServer(tokens=16).run_in_thread() as server:
        status = main(["probe", server.url + CHAT, "--json", "-d", f"@{body_file}"])
        obj = _one_json(capsys.readouterr().out)
        assert status == 0
        (record,) = server.records
    assert record.stream is True
    assert record.behavior.tokens == 5  # max_tokens from the file set the response length
    assert record.prompt_tokens == 5  # the five words of the message in the file
    assert obj["input_tokens"] == 5
    assert obj["output_tokens"] == 5
    assert obj["output_tokens_source"] == "usage"
    assert obj["method"] == "POST"


def test_method_defaults_to_get_without_a_body_and_x_overrides_it(
    llm: SubprocessLLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", llm.url + "/health", "--json"]) == 0
    obj = _one_json(capsys.readouterr().out)
    assert (obj["method"], obj["status"], obj["error"]) == ("GET", 200, None)
    assert obj["ttft_s"] is None and obj["output_tokens"] is None
    _check_design_contract(obj)

    assert main(["probe", llm.url + "/health", "--json", "-X", "POST"]) == 1  # GET-only route
    obj = _one_json(capsys.readouterr().out)
    assert (obj["method"], obj["status"], obj["error_type"]) == ("POST", 405, "http_status")


# --- text output ---------------------------------------------------------------------------


def test_text_waterfall_lists_stages_and_e2e(
    llm: SubprocessLLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", llm.url + CHAT, "-d", json.dumps(chat_body())]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "\x1b[" not in out  # capsys is not a terminal: no colour
    names = [line.split()[0] for line in out.splitlines()[2:] if line.strip()]
    for stage in ("pool_wait", "connect", "send", "wait", "first_token", "decode", "tail", "e2e"):
        assert stage in names, out
    assert out.splitlines()[0] == f"POST {llm.url}{CHAT}"
    assert "HTTP/1.1" in out.splitlines()[1]
    e2e_line = next(line for line in out.splitlines() if line.split()[:1] == ["e2e"])
    injected_ms = 1e3 * (HEADER_DELAY + PREFILL + (TOKENS - 1) * DECODE)
    assert injected_ms - 0.5 <= float(e2e_line.split()[1]) <= injected_ms + 20  # one sample
    assert f"{TOKENS} output tokens" in out


# --- failures ---------------------------------------------------------------------------------


def test_connection_refused_exits_1_with_error(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}{CHAT}"
    assert main(["probe", url, "--json", "-d", json.dumps(chat_body())]) == 1
    obj = _one_json(capsys.readouterr().out)
    _check_design_contract(obj)
    assert obj["error_type"] == "connect"
    assert isinstance(obj["error"], str) and obj["error"]
    assert obj["http_version"] is None and obj["ttft_s"] is None
    assert "connect" in obj["stages"]


def test_connection_refused_text_says_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["probe", f"http://127.0.0.1:{_closed_port()}/"]) == 1
    out = capsys.readouterr().out
    assert "error (connect):" in out
    assert "(interrupted)" in out  # the connect stage was cut short, and it is shown


def test_http_error_status_exits_1_with_error(
    llm: SubprocessLLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    body = json.dumps(chat_body(fault="http_error"))
    assert main(["probe", llm.url + CHAT, "--json", "-d", body]) == 1
    obj = _one_json(capsys.readouterr().out)
    _check_design_contract(obj)
    assert obj["status"] == 400
    assert obj["error_type"] == "http_status"
    assert obj["error"].startswith("HTTP 400")
    assert "testbed http_error 400" in obj["error"]  # vLLM-style body's message is kept
    assert obj["http_version"] == "1.1"
    assert HEADER_DELAY - 0.0005 <= obj["stages"]["wait"] <= HEADER_DELAY + 0.010  # one sample


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["probe", "ftp://x"], "not an http(s) URL"),
        (["probe", "ftp://x", "--json"], "not an http(s) URL"),
        (["probe", "http://127.0.0.1:9/", "-d", "@/nonexistent/body.json"], "body.json"),
        (["probe", "https://127.0.0.1:9/", "--insecure", "--cacert", "CA"], "either"),
        (["probe", "http://h.test/", "--resolver", "not-an-ip"], "resolver"),
    ],
)
def test_usage_errors_exit_2_with_a_message_on_stderr(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    if "CA" in argv:  # a real PEM, so the conflict is what fails, not the missing file
        argv = [a if a != "CA" else str(TestCA().ca_pem_path(tmp_path)) for a in argv]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("latency-analyzer: ")
    assert needle in err


def test_malformed_header_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["probe", "http://127.0.0.1:9/", "-H", "no-colon-here"])
    assert exc.value.code == 2
    assert "Name: value" in capsys.readouterr().err


# --- DNS and TLS ------------------------------------------------------------------------------


def test_resolver_option_asks_the_given_dns_server(
    llm: SubprocessLLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    delay = 0.020
    before = len(llm.records)
    with DNSServer(delay=delay).run_in_thread() as dns:
        url = f"http://llm.test:{llm.port}{CHAT}"
        status = main(["probe", url, "--json", "--resolver", dns.nameserver, "-d", "{}"])
        obj = _one_json(capsys.readouterr().out)
        queries = list(dns.queries)
    assert status == 0, obj["error"]
    _check_design_contract(obj)
    assert ("llm.test", "A") in queries
    # the A and AAAA lookups each wait `delay`: the stage holds at least that. It ended before
    # the LLM server (its own process, the same CLOCK_MONOTONIC) read the request: a bound that
    # a busy host cannot move, where a fixed margin above the delay could be overrun.
    stages = obj["stages"]
    assert stages["dns"] >= delay - 0.0005
    start_ns = process_anchor().to_perf_ns(obj["start_epoch_ns"])  # this process ran the client
    dns_end_ns = start_ns + round((stages.get("pool_wait", 0.0) + stages["dns"]) * 1e9)
    (record,) = llm.records[before:]
    assert dns_end_ns <= record.received_ns
    assert obj["url"] == url


def test_resolver_nxdomain_is_a_dns_error(capsys: pytest.CaptureFixture[str]) -> None:
    with DNSServer(nxdomain=["gone.test"]).run_in_thread() as dns:
        url = f"http://gone.test:{_closed_port()}/"
        assert main(["probe", url, "--json", "--resolver", dns.nameserver]) == 1
    obj = _one_json(capsys.readouterr().out)
    _check_design_contract(obj)
    assert obj["error_type"] == "dns"
    assert "dns" in obj["stages"]


def test_cacert_trusts_the_test_ca(
    tls_llm: SubprocessLLMServer, ca: TestCA, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pem = ca.ca_pem_path(tmp_path)
    url = f"https://localhost:{tls_llm.port}{CHAT}"
    assert main(["probe", url, "--json", "--cacert", str(pem), "-d", json.dumps(chat_body())]) == 0
    obj = _one_json(capsys.readouterr().out)
    _check_design_contract(obj)
    assert obj["error"] is None
    assert {"connect", "tls"} <= obj["stages"].keys()
    assert obj["tls"]["version"] in ("TLSv1.2", "TLSv1.3")
    assert obj["tls"]["server_hostname"] == "localhost"
    assert obj["output_tokens"] == 4


def test_without_cacert_the_test_ca_is_not_trusted(
    tls_llm: SubprocessLLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", tls_llm.url + CHAT, "--json", "-d", json.dumps(chat_body())]) == 1
    obj = _one_json(capsys.readouterr().out)
    _check_design_contract(obj)
    assert obj["error_type"] == "tls"
    assert obj["http_version"] is None
    assert "tls" in obj["stages"]


@pytest.mark.parametrize("flag", ["--insecure", "-k"])
def test_insecure_skips_verification(
    tls_llm: SubprocessLLMServer, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The test CA is not trusted, yet the probe succeeds: verification was skipped, not the
    handshake. Truth: a capture on ``lo`` (kernel stamps) sees one connection, and ``tls``
    lasts at least from its ClientHello to the server's flight that completed it."""
    require_tcpdump()
    with TcpDump(f"tcp port {tls_llm.port}") as capture:
        argv = ["probe", tls_llm.url + CHAT, "--json", flag, "-d", json.dumps(chat_body())]
        assert main(argv) == 0
    obj = _one_json(capsys.readouterr().out)
    _check_design_contract(obj)
    assert obj["error"] is None
    assert obj["tls"]["version"] in ("TLSv1.2", "TLSv1.3")
    (hs,) = handshakes(capture.packets(), tls_llm.port)
    assert hs.hello_ns is not None and hs.flight_end_ns is not None
    on_the_wire = (hs.flight_end_ns - hs.hello_ns - LOOPBACK_NS) / 1e9
    assert obj["stages"]["tls"] >= on_the_wire, (obj["stages"], on_the_wire)


# --- as a process, and the demo ---------------------------------------------------------------


def _wire_boundaries(flow: Flow) -> tuple[int, int, list[int]]:
    """Capture stamps (epoch ns) of the server's byte ending the headers and of the byte ending
    the first content-carrying event, and of every server segment: the kernel's, on lo."""
    data = flow.data("in")
    headers_end = data.index(b"\r\n\r\n") + 3
    for match in re.finditer(rb"data: ([^\n]*)\n\n", data[headers_end:]):
        if match.group(1) == b"[DONE]":
            continue
        choices = json.loads(match.group(1)).get("choices") or [{}]
        if choices[0].get("delta", {}).get("content"):
            token_end = headers_end + match.end() - 1
            break
    else:
        raise AssertionError("no content token on the wire")
    arrivals = [p.time_ns for p in flow.segments("in")]
    return flow.time_of_byte("in", headers_end), flow.time_of_byte("in", token_end), arrivals


def test_probe_as_a_subprocess(llm: SubprocessLLMServer) -> None:
    require_tcpdump()
    cmd = [sys.executable, "-m", "latency_analyzer.cli", "probe", llm.url + CHAT, "--json"]
    before = len(llm.records)
    with Steal() as steal, PacketCapture(llm.port) as cap:
        done = subprocess.run(
            [*cmd, "-d", json.dumps(chat_body()), "-H", "X-Trace: cli-test"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    obj = _one_json(done.stdout)
    _check_design_contract(obj)
    assert obj["http_version"] == "1.1"
    assert obj["output_tokens"] == TOKENS
    # first_token runs from the headers' arrival to the first token's: the kernel's stamps of
    # the reads that brought them, which host load cannot move. Truth: a capture on lo, whose
    # stamps are the kernel's too; a client that came late reads several segments at once (the
    # headers with the next chunk, the token with later ones), stamped with the read's last,
    # so each end is held to the captured segment that ended its read. The server's log
    # (stamped before each write) says the token was no earlier than the prefill allows.
    (record,) = llm.records[before:]
    assert record.headers_ns is not None and record.chunk_ns
    assert record.chunk_ns[0] - record.received_ns >= PREFILL * 1e9
    (flow,) = cap.flows()
    headers, token, arrivals = _wire_boundaries(flow)
    assert process_anchor().to_perf_ns(token) >= record.chunk_ns[0]
    token_ns = obj["start_epoch_ns"] + round(obj["ttft_s"] * 1e9)  # the CLI's anchor, epoch
    headers_ns = token_ns - round(obj["stages"]["first_token"] * 1e9)
    # a segment the kernel delivered late (the hypervisor stopped the vCPU between the two
    # stamps) is let past per stolen jiffy, late: wire_bounds
    errors = [
        read_end_error(t, own, arrivals, ANCHOR_SLACK_NS)
        for t, own in ((token_ns, token), (headers_ns, headers))
    ]
    hold_each("probe read ends vs the wire", errors, LOOPBACK_NS, steal)


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"latency-analyzer {la.__version__}"


def test_demo_json_prints_a_cold_and_a_warm_waterfall_and_the_diagnosis(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    cold, warm, dx = (json.loads(line) for line in lines)
    # the demo's injected delays, in its servers' process, are floors no reading may go below:
    # a round trip through the proxy for the request, the prefill before the first token and
    # a decode step before each later one (and, cold, the DNS delay and the TLS round trip)
    rtt = 2 * demo.ONE_WAY
    last_token = demo.PREFILL + (demo.TOKENS - 1) * demo.DECODE
    for obj, setup in ((cold, demo.DNS_DELAY + rtt), (warm, 0.0)):
        _check_design_contract(obj)
        assert obj["error"] is None
        assert obj["output_tokens"] == demo.TOKENS
        assert obj["http_version"] == "1.1"
        assert obj["stages"]["wait"] >= rtt
        assert obj["ttft_s"] >= setup + rtt + demo.PREFILL
        assert obj["e2e_s"] >= setup + rtt + last_token
    assert cold["stages"]["dns"] >= demo.DNS_DELAY and cold["stages"]["tls"] >= rtt
    assert cold["connection_reused"] is False
    assert warm["connection_reused"] is True
    assert {"dns", "connect", "tls"} <= cold["stages"].keys()
    assert not {"dns", "connect", "tls"} & warm["stages"].keys()
    # the server offers h2 (asked through the demo's own resolver), the client only http/1.1
    assert dx["alpn"] == "h2"
    # the injected story; on a busy host the proxy's pacing may add a true itl_jitter finding
    assert {"dns", "new_connection", "http1"} <= {f["rule"] for f in dx["findings"]}
    assert dx["what_if"]["then_s"] == pytest.approx(
        cold["ttft_s"] - sum(cold["stages"].get(s, 0.0) for s in dx["what_if"]["stages"])
    )


def test_demo_text_holds_each_stage_to_the_servers_log_and_ends_with_the_what_if(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("== injected vs measured") : out.index("== diagnosis")]
    for row in ("dns (cold)", "tls (cold)", "wait (warm)", "first_token", "tpot (warm)"):
        line = next(line for line in table.splitlines() if line.strip().startswith(row))
        assert "ok (" in line or "off by" in line, line  # every row has a verdict
    tail = out.rstrip().splitlines()[-1]
    assert tail.startswith("what-if: with ") and "TTFT" in tail and "instead of" in tail
    assert "[dns]" in out and "[new_connection]" in out and "[http1]" in out


# --- secrets ----------------------------------------------------------------------------------

SECRET_HEADERS = {
    "Authorization": "Bearer sk-PLANTED-123",
    "api-key": "PLANTED-456",
    "x-api-key": "PLANTED-789",
    "Cookie": "session=PLANTED-000",
}
SECRET_QUERY = "api_key=PLANTED-QS"


@dataclass
class _Seen:
    headers: list[dict[str, str]] = field(default_factory=list)
    queries: list[dict[str, str]] = field(default_factory=list)


@contextmanager
def _header_recorder() -> Iterator[tuple[str, _Seen]]:
    """A loopback SSE endpoint that records the headers and query of every request."""
    seen = _Seen()

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.headers.append(dict(request.headers))
        seen.queries.append(dict(request.query))
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for word in ("one ", "two "):
            delta = {"choices": [{"index": 0, "delta": {"content": word}}]}
            await resp.write(f"data: {json.dumps(delta)}\n\n".encode())
        await resp.write_eof(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> int:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return int(runner.addresses[0][1])

    try:
        port = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
        yield f"http://127.0.0.1:{port}", seen
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _secret_args() -> list[str]:
    return [arg for name, value in SECRET_HEADERS.items() for arg in ("-H", f"{name}: {value}")]


def _assert_no_secret(text: str) -> None:
    assert "PLANTED" not in text, text


def test_secrets_never_reach_cli_output(capsys: pytest.CaptureFixture[str]) -> None:
    with _header_recorder() as (base, seen):
        url = f"{base}{CHAT}?{SECRET_QUERY}&model=m"
        body = json.dumps(chat_body())
        assert main(["probe", url, "--json", "-d", body, *_secret_args()]) == 0
        json_out, json_err = capsys.readouterr()
        assert main(["probe", url, "-d", body, *_secret_args()]) == 0
        text_out, text_err = capsys.readouterr()
    # not vacuous: the server did get every secret, both times
    assert len(seen.headers) == 2
    for headers, query in zip(seen.headers, seen.queries, strict=True):
        for name, value in SECRET_HEADERS.items():
            assert headers.get(name) == value
        assert query["api_key"] == "PLANTED-QS"
        assert query["model"] == "m"
    for text in (json_out, json_err, text_out, text_err):
        _assert_no_secret(text)
    obj = _one_json(json_out)
    assert obj["error"] is None and obj["output_tokens"] == 2
    assert "model=m" in obj["url"]  # the rest of the query is kept


def test_secret_query_value_reads_as_stars_in_the_recorded_url(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # README: secret-looking query parameters "are replaced by `***` in the recorded URL"
    with _header_recorder() as (base, _):
        assert main(["probe", f"{base}/v1/models?{SECRET_QUERY}"]) == 0
    headline = capsys.readouterr().out.splitlines()[0]
    assert headline == f"GET {base}/v1/models?api_key=***"


def test_redaction_keeps_the_other_query_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    # only the secret's value may change in the recorded URL; a blank flag is still a parameter
    with _header_recorder() as (base, seen):
        assert main(["probe", f"{base}/v1/models?verbose=&{SECRET_QUERY}&n=1", "--json"]) == 0
    assert seen.queries[0] == {"verbose": "", "api_key": "PLANTED-QS", "n": "1"}
    url = _one_json(capsys.readouterr().out)["url"]
    assert url.startswith(f"{base}/v1/models?verbose=&api_key=")
    assert url.endswith("&n=1")


def test_secrets_never_reach_waterfall_repr_or_summary() -> None:
    with _header_recorder() as (base, seen):
        wf = la.probe(f"{base}{CHAT}?{SECRET_QUERY}", json=chat_body(), headers=SECRET_HEADERS)
    assert seen.headers[0]["Authorization"] == SECRET_HEADERS["Authorization"]
    assert wf.ok, wf.error
    for text in (repr(wf), str(wf.summary()), json.dumps(wf.summary()), str(wf.root)):
        _assert_no_secret(text)


def test_secrets_never_reach_output_of_failed_requests(
    capsys: pytest.CaptureFixture[str],
) -> None:
    refused = f"http://127.0.0.1:{_closed_port()}{CHAT}?{SECRET_QUERY}"
    assert main(["probe", refused, "--json", *_secret_args()]) == 1
    assert main(["probe", refused, *_secret_args()]) == 1
    assert main(["probe", f"ftp://127.0.0.1/x?{SECRET_QUERY}", *_secret_args()]) == 2
    out, err = capsys.readouterr()
    _assert_no_secret(out)
    _assert_no_secret(err)


def test_url_userinfo_is_not_recorded(capsys: pytest.CaptureFixture[str]) -> None:
    with _header_recorder() as (base, seen):
        url = base.replace("http://", "http://user:PLANTED-PW@") + CHAT
        assert main(["probe", url, "--json", "-d", json.dumps(chat_body())]) == 0
    assert seen.headers[0]["Authorization"].startswith("Basic ")  # the credentials were sent
    out, err = capsys.readouterr()
    _assert_no_secret(out + err)
    assert _one_json(out)["url"] == f"{base}{CHAT}"


def test_probe_count_diagnose_of_a_refused_connection_says_it_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/"
    assert main(["probe", url, "--count", "2", "--diagnose"]) == 1
    out = capsys.readouterr().out
    assert "the request failed (connect)" in out and "what-if" not in out
    assert main(["probe", url, "--count", "2", "--diagnose", "--json"]) == 1
    obj = json.loads(capsys.readouterr().out)
    assert [r["error_type"] for r in obj["requests"]] == ["connect", "connect"]
    assert obj["cold"]["findings"] == [] and obj["warm"] is None
    assert obj["server_alpn"] is None  # nothing is negotiated over http://
    assert main(["probe", url, "--count", "0"]) == 2
    assert "--count must be at least 1" in capsys.readouterr().err


def test_the_demos_warm_wait_truth_is_the_proxys_side_facing_the_client() -> None:
    """The request's last bytes as the proxy received them from the client, to its write of
    the first bytes the server sent after logging its headers: the relays around them (an
    earlier request's, a later token's) are not taken."""
    ms = 1_000_000
    relay = ("upstream", "received_ns", "sent_ns")
    relays = [
        dict(zip(relay, row, strict=True))
        for row in (
            (True, 1 * ms, 21 * ms),  # the request's first bytes
            (True, 2 * ms, 22 * ms),  # its last, forwarded before the server had it all
            (True, 30 * ms, 50 * ms),  # a later request
            (False, 22 * ms + 300_000, 42 * ms + 300_000),  # an earlier response's tail
            (False, 23 * ms, 43 * ms),  # the headers, after the server logged them
            (False, 24 * ms, 44 * ms),  # a token
        )
    ]
    # the server had the request at 22.4 ms and logged its headers at 22.8 ms
    got = demo._proxied_wait(relays, 22 * ms + 400_000, 22 * ms + 800_000)
    assert got == pytest.approx((43 - 2) / 1e3)
    assert demo._proxied_wait([], 22 * ms, 23 * ms) is None  # no proxy: nothing to hold it to


def test_the_bed_logs_what_its_proxy_relayed() -> None:
    """With a one-way delay the bed's truth carries the proxy's relays, both ways, each
    written no sooner than the delay after the kernel had it."""
    with TestBed(one_way=0.005, tokens=2) as bed:
        wf = la.probe(bed.url, resolver=bed.resolver, ssl=bed.client_context(), json=chat_body())
        relays = bed.truth()["relays"]
    assert wf.ok, wf.error
    assert {r["upstream"] for r in relays} == {True, False}
    assert all(r["sent_ns"] - r["received_ns"] >= 5_000_000 for r in relays)
    assert {r["connection"] for r in relays} == {1}


@pytest.mark.parametrize("given", [None, "2"])
def test_the_cli_keeps_blas_to_one_thread_unless_told(given: str | None) -> None:
    """numpy's OpenBLAS threads spin after start-up on the cores a run needs: the CLI asks for
    one, before numpy loads (no thread beside the main one), and keeps a value the user set
    (OpenBLAS's threads beside the main one: as many as asked, less one, on a 2-core host)."""
    code = (
        "import os, sys; import latency_analyzer.cli; "
        "print(os.environ['OPENBLAS_NUM_THREADS'], 'numpy' in sys.modules, "
        "len(os.listdir('/proc/self/task')))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    value, loaded, threads = out.stdout.split()
    assert (value, loaded) == (given or "1", "True")
    if given is None:
        assert threads == "1"
    elif (os.cpu_count() or 1) >= 2:
        assert threads == "2"
