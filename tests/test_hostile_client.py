"""What the client does with hostile or surprising answers: redirects, cut unframed bodies,
old TLS, and a Client used after close or from a second event loop."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import warnings
from collections.abc import AsyncIterator, Iterator

import pytest

import latency_analyzer as la
from latency_analyzer import UsageError
from latency_analyzer.testing import TestCA
from latency_analyzer.testing.hostile_server import HostileServer

SECRET_HEADERS = {
    "Authorization": "Bearer Zredirect-auth-0001",
    "api-key": "Zredirect-apikey-0002",
    "X-Api-Key": "Zredirect-xapikey-0003",
    "Cookie": "session=Zredirect-cookie-0004",
    "X-Session-Token": "Zredirect-token-0005",
}


@pytest.fixture
async def pair() -> AsyncIterator[tuple[HostileServer, HostileServer]]:
    async with HostileServer() as a, HostileServer() as b:
        yield a, b


async def test_redirects_are_not_followed_by_default(
    pair: tuple[HostileServer, HostileServer],
) -> None:
    a, b = pair
    async with la.Client() as client:
        wf = await client.request(f"{a.url}/redirect/302?to={b.url}/x?sig=Zsigned-0001")
    assert wf.status == 302 and wf.ok
    assert wf.attributes["http.location"] == f"{b.url}/x?sig=***"
    assert b.requests == []


async def test_a_redirect_to_another_origin_drops_every_secret_header(
    pair: tuple[HostileServer, HostileServer],
) -> None:
    a, b = pair
    async with la.Client(follow_redirects=True, headers={"X-Api-Key": "Zdefault-key-0006"}) as c:
        wf = await c.request(f"{a.url}/redirect/307?to={b.url}/landed", headers=SECRET_HEADERS)
    assert wf.ok and wf.status == 200
    first, second = a.requests[0].headers, b.requests[0].headers
    assert {k.lower() for k in SECRET_HEADERS} <= {k.lower() for k in first}
    assert not {k.lower() for k in second} & {k.lower() for k in (*SECRET_HEADERS, "x-api-key")}
    assert b.requests[0].target == "/landed"


async def test_a_redirect_on_the_same_origin_keeps_the_headers(
    pair: tuple[HostileServer, HostileServer],
) -> None:
    a, _ = pair
    async with la.Client(follow_redirects=True) as client:
        await client.request(f"{a.url}/redirect/302?to=/landed", headers=SECRET_HEADERS)
    assert a.requests[1].target == "/landed"
    assert a.requests[1].headers["X-Api-Key"] == SECRET_HEADERS["X-Api-Key"]


async def test_each_hop_is_its_own_request_and_the_chain_is_recorded_redacted(
    pair: tuple[HostileServer, HostileServer],
) -> None:
    a, b = pair
    start = f"{a.url}/redirect/301?to={b.url}/redirect/303%3Fto%3D/end&api_key=Zquery-0007"
    async with la.Client(follow_redirects=True) as client:
        wf = await client.request(start)
    assert wf.url == f"{b.url}/end" and wf.status == 200
    assert wf.attributes["redirects"] == 2
    assert [wf.attributes[f"redirect.{i}.status"] for i in (0, 1)] == [301, 303]
    assert (
        wf.attributes["redirect.0.url"]
        == f"{a.url}/redirect/301?to={b.url}/redirect/303%3Fto%3D/end&api_key=***"
    )
    assert wf.attributes["redirect.1.url"] == f"{b.url}/redirect/303?to=/end"
    assert "Zquery-0007" not in repr(dict(wf.attributes))
    # the last hop is on the second hop's origin: it reuses that hop's connection
    assert wf.connection.reused
    assert all(isinstance(wf.attributes[f"redirect.{i}.e2e_ns"], int) for i in (0, 1))


async def test_a_redirect_loop_stops_with_an_error(
    pair: tuple[HostileServer, HostileServer],
) -> None:
    a, _ = pair
    async with la.Client(follow_redirects=True, max_redirects=3) as client:
        wf = await client.request(f"{a.url}/redirect/302?to=/redirect/302%3Fto%3D/redirect/302")
    assert wf.error_type == "redirect"
    assert len(a.requests) == 4


# --- failures that say what happened -------------------------------------------------------
async def test_an_unframed_body_cut_by_a_reset_is_an_error(
    pair: tuple[HostileServer, HostileServer],
) -> None:
    a, _ = pair
    async with la.Client() as client:
        wf = await client.request(f"{a.url}/unframed-rst")
    assert wf.error_type == "reset", (wf.error_type, wf.error)
    assert wf.stage("wait") is not None


@pytest.fixture(scope="module", params=["alert", "close"])
def tls10_server(ca: TestCA, request: pytest.FixtureRequest) -> Iterator[int]:
    """A TLS server that speaks only TLS 1.0, as an old appliance would: it either answers
    our ClientHello with a protocol-version alert, or reads it and closes the connection."""
    closes = request.param == "close"
    context = ca.server_context()
    try:
        with warnings.catch_warnings():  # deprecated: that is the point of this server
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = ssl.TLSVersion.TLSv1
            context.maximum_version = ssl.TLSVersion.TLSv1
        context.set_ciphers("DEFAULT:@SECLEVEL=0")
    except (ValueError, ssl.SSLError) as exc:
        pytest.skip(f"this OpenSSL cannot serve TLS 1.0: {exc}")
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    if closes:
                        conn.recv(4096)
                    else:
                        context.wrap_socket(conn, server_side=True).close()
                except (OSError, ssl.SSLError):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


async def test_a_tls_1_0_only_server_fails_in_tls(tls10_server: int, ca: TestCA) -> None:
    wf = await la.aprobe(f"https://localhost:{tls10_server}/", ssl=ca.client_context())
    assert wf.error_type == "tls", (wf.error_type, wf.error)
    assert wf.stage("connect") is not None and wf.stage("tls") is not None
    assert "ssl:default" not in (wf.error or "")


# --- usage errors --------------------------------------------------------------------------
async def test_a_closed_client_raises_instead_of_reopening(
    pair: tuple[HostileServer, HostileServer],
) -> None:
    a, _ = pair
    client = la.Client()
    async with client:
        assert (await client.request(f"{a.url}/ok")).ok
    with pytest.raises(UsageError, match="closed"):
        await client.request(f"{a.url}/ok")
    with pytest.raises(UsageError, match="closed"):
        async with client:
            pass
    assert len(a.requests) == 1


def test_a_client_used_on_a_second_loop_is_a_usage_error() -> None:
    with HostileServer().run_in_thread() as server:
        client = la.Client()

        async def first() -> la.Waterfall:
            return await client.request(f"{server.url}/ok")

        home = asyncio.new_event_loop()
        try:
            assert home.run_until_complete(first()).ok
            with pytest.raises(UsageError, match="another event loop"):
                asyncio.run(first())
            assert len(server.requests) == 1
        finally:
            home.run_until_complete(client.close())
            home.close()


def test_cli_follows_redirects_only_with_location_flag(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from latency_analyzer.cli import main

    with HostileServer().run_in_thread() as server:
        base = server.url
        url = f"{base}/redirect/302?to=/landed"
        assert main(["probe", url, "--json"]) == 0
        assert main(["probe", url, "--json", "-L"]) == 0
        targets = [r.target for r in server.requests]
    first, second = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert (first["status"], first["url"]) == (302, url)
    assert (second["status"], second["url"]) == (200, f"{base}/landed")
    assert targets == ["/redirect/302?to=/landed", "/redirect/302?to=/landed", "/landed"]
