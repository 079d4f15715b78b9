"""Every request option on the command line and in the scenario file, each checked.

An option that cannot apply in the chosen mode exits 2 with a message naming it; headers reach
the server (the test bed keeps what it received) and never the run file or the output.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from latency_analyzer.cli import main as cli_main
from latency_analyzer.errors import UsageError
from latency_analyzer.load import Scenario, load_scenario
from latency_analyzer.testing import LLMServer

CHAT = "/v1/chat/completions"
URL = "http://127.0.0.1:9" + CHAT  # never contacted: every case below fails before a request
SECRET = "sk-test-0123456789abcdef"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--rate", "50", "--duration", "2"], "--rate"),
        (["--mode", "closed", "--rate", "5", "--requests", "3"], "--rate"),
        (["--max-in-flight", "4", "--requests", "3"], "--max-in-flight"),
        (
            ["--mode", "open", "--rate", "5", "--concurrency", "4", "--requests", "3"],
            "--concurrency",
        ),
        (
            ["--mode", "open", "--rate", "5", "--concurrency", "1", "--requests", "3"],
            "--concurrency",
        ),
        (["--requests", "3", "-H", "no colon here"], "--header"),
        (["--requests", "3", "--header-env", "Authorization"], "--header-env"),
        (
            ["--requests", "3", "--header-env", "Authorization=LA_TEST_UNSET_VARIABLE"],
            "LA_TEST_UNSET_VARIABLE",
        ),
        (["--requests", "3", "--body-extra", "{not json"], "--body-extra"),
        (["--requests", "3", "--body-extra", "[1, 2]"], "--body-extra"),
        (["--requests", "3", "--max-tokens", "0"], "--max-tokens"),
        (["--requests", "3", "--model"], "--model"),
    ],
)
def test_an_option_that_cannot_apply_exits_2_naming_it(
    flags: list[str],
    named: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.delenv("LA_TEST_UNSET_VARIABLE", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        code = cli_main(["run", "--url", URL, *flags])
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert named in err
    assert "no colon here" not in err  # a malformed -H may hold a secret: never echoed
    assert list(tmp_path.iterdir()) == []  # refused before anything ran: no run file


@pytest.mark.parametrize(
    ("toml", "named"),
    [
        ("rate = 5\nrequests = 1\n", "'rate'"),
        ("max_in_flight = 2\nrequests = 1\n", "'max_in_flight'"),
        ('mode = "open"\nrate = 5\nrequests = 1\nconcurrency = 3\n', "'concurrency'"),
        ('mode = "open"\nrate = 5\nrequests = 1\nthink_time = 0.1\n', "'think_time'"),
        ('mode = "open"\nrate = 5\nrequests = 1\nburstiness = 2.0\n', "'burstiness'"),
        ('requests = 1\nheaders = {"Bad Name" = "x"}\n', "'headers'"),
        ("requests = 1\nheaders = {X-Key = 3}\n", "'headers'"),
        ('requests = 1\nheader_env = {Authorization = "not a name"}\n', "'header_env'"),
        ("requests = 1\nbody_extra = 3\n", "'body_extra'"),
    ],
)
def test_a_scenario_file_key_that_cannot_apply_is_an_error_naming_it(
    tmp_path: Path, toml: str, named: str
) -> None:
    f = tmp_path / "s.toml"
    f.write_text(f'url = "{URL}"\n{toml}')
    with pytest.raises(UsageError, match=named) as exc:
        load_scenario(f)
    assert str(exc.value).startswith(str(f))


def test_header_values_are_not_in_the_scenario_record_or_its_repr() -> None:
    sc = Scenario(URL, requests=1, headers={"X-Api-Key": SECRET}, header_env={"A": "B"})
    assert SECRET not in repr(sc) and SECRET not in json.dumps(sc.to_dict())
    assert sc.to_dict()["header_names"] == ["A", "X-Api-Key"]
    again = Scenario.from_dict(sc.to_dict())  # a stored scenario reads back (without values)
    assert again.headers == {} and again.header_env == {"A": "B"}


def test_headers_model_body_and_max_tokens_reach_the_server_and_not_the_run_file(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run.jsonl"
    toml = tmp_path / "s.toml"
    with LLMServer(tokens=2, record_requests=True).run_in_subprocess() as s:
        toml.write_text(
            f'url = "{s.url}{CHAT}"\nrequests = 4\n'
            'headers = {X-From-File = "file-value"}\n'
            'header_env = {Authorization = "LA_TEST_API_KEY"}\n'
            "body_extra = {temperature = 0, seed = 7}\n"
        )
        exe = Path(sys.executable).with_name("latency-analyzer")
        argv = [str(exe), "run", str(toml), "--out", str(out)]
        argv += ["--model", "my-model", "-H", f"X-Api-Key: {SECRET}", "--max-tokens", "3"]
        argv += ["--body-extra", '{"top_p": 0.5}', "--workers", "1"]
        env = {"LA_TEST_API_KEY": f"Bearer {SECRET}-env", "PATH": "/usr/bin:/bin"}
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        records = s.records
    assert proc.returncode == 0, proc.stderr
    assert len(records) == 4
    for r in records:
        assert r.headers is not None and r.body is not None
        assert r.headers["X-Api-Key"] == SECRET
        assert r.headers["Authorization"] == f"Bearer {SECRET}-env"
        assert r.headers["X-From-File"] == "file-value"
        assert r.body["model"] == "my-model" and r.body["max_tokens"] == 3
        assert r.body["top_p"] == 0.5 and r.body["temperature"] == 0  # file's and flag's
        assert r.body["seed"] == 7
    text = out.read_text()
    assert SECRET not in text and "file-value" not in text
    assert SECRET not in proc.stdout + proc.stderr
    header = json.loads(text.splitlines()[0])
    assert header["meta"]["scenario"]["header_names"] == [
        "Authorization",
        "X-Api-Key",
        "X-From-File",
    ]


def test_headers_reach_the_server_from_worker_processes(tmp_path: Path) -> None:
    from latency_analyzer.load import run_sync

    with LLMServer(tokens=2, record_requests=True).run_in_subprocess() as s:
        sc = Scenario(s.url + CHAT, requests=4, concurrency=2, headers={"X-Api-Key": SECRET})
        result = run_sync(sc, workers=2, path=tmp_path / "w.jsonl", rtt_samples=0)
        records = s.records
    assert result.issued == 4 and len(records) == 4
    assert all(r.headers is not None and r.headers["X-Api-Key"] == SECRET for r in records)
    assert SECRET not in (tmp_path / "w.jsonl").read_text()
