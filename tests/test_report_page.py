"""``latency-analyzer report``: one self-contained page, opened in a real (headless) browser."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from latency_analyzer.analysis import Tags, WaterfallSet
from latency_analyzer.cli import main
from latency_analyzer.testing.waterfalls import synthetic
from latency_analyzer.timeline import TlsInfo

pytest.importorskip("matplotlib")

TLS = TlsInfo("TLSv1.3", "TLS_AES_128_GCM_SHA256", "http/1.1", False, "llm.test")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip


def _run(path: Path, name: str, wait_ms: float, cold_every: int) -> Path:
    with WaterfallSet(path, meta={"scenario": {"name": name, "mode": "closed"}}) as ws:
        for i in range(40):
            cold = i % cold_every == 0
            stages = {"dns": 23.0, "connect": 0.2, "tls": 41.0} if cold else {}
            wf = synthetic(
                start_ms=100.0 * i, send=0.1, wait=wait_ms + (i % 7), first_token=18.0,
                gaps=[2.0] * 10, tail=0.2, reused=not cold, tls_info=TLS if cold else None,
                connection_id=i // cold_every, **stages,
            )  # fmt: skip
            ws.add(wf, Tags(scenario=name, warmup=i < 2))
        ws.add(synthetic(start_ms=4100.0, send=0.1, wait=3.0, status=None, error_type="reset"),
               Tags(scenario=name))  # fmt: skip
    return path


@pytest.fixture
def page(tmp_path: Path) -> Path:
    a = _run(tmp_path / "vendor-a.jsonl", "vendor-a", wait_ms=40.0, cold_every=1)
    b = _run(tmp_path / "vendor-b.jsonl", "vendor-b", wait_ms=20.0, cold_every=40)
    out = tmp_path / "report.html"
    assert main(["report", str(a), str(b), "-o", str(out)]) == 0
    return out


def test_the_page_holds_every_section_and_needs_no_network(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    for heading in (
        "Percentiles", "Distributions", "Comparison", "vendor-a: conditions and percentiles",
        "vendor-a: diagnosis", "vendor-b: the 3 slowest requests",
    ):  # fmt: skip
        assert f">{heading}</h2>" in text, heading
    assert "DNS on every request" in text and "what-if: with " in text  # vendor-a's client
    assert "bootstrap confidence interval" in text and "conditions: " in text
    # every image is inline, nothing is fetched: no URL in src/href, and a CSP forbidding it
    sources = re.findall(r'(?:src|href)="([^"]*)"', text)
    assert len(sources) == 4 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "default-src 'none'" in text
    assert text.count("<svg ") == 6  # 3 slowest waterfalls per run


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing under CI (.ci/run installs it)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return exe


def test_a_browser_renders_it_without_errors(page: Path, tmp_path: Path) -> None:
    exe = _chromium()
    profile = tmp_path / "profile"
    base = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    dom = subprocess.run(
        [*base, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    # the page's own script marks the body once every image has decoded (a broken or blocked
    # image reads "broken N"; a fetch the CSP blocks is logged to the console, checked next)
    assert 'data-rendered="ok 4"' in dom.stdout, dom.stdout[:500]
    console = [
        line for line in dom.stderr.splitlines()
        if "CONSOLE" in line or "Uncaught" in line or "Content Security Policy" in line
    ]  # fmt: skip
    assert console == []
    shot = tmp_path / "report.png"
    subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri()],
        capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size == (1280, 2000)
        colours = im.convert("RGB").getcolors(maxcolors=1_000_000) or []
    assert len(colours) > 100  # plots and tables drawn, not a blank or error page
