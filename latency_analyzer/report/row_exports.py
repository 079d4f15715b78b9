"""Tabular exports: JSONL (canonical, round-trips), CSV, pandas DataFrame and Parquet.

* JSONL is the ``WaterfallSet`` file format: a ``run`` header line (whose ``meta.export``
  holds the version stamp), then one ``wf`` line per waterfall with its canonical
  ``Waterfall.to_dict()``. ``read_jsonl`` and ``WaterfallSet.load`` both read it back exactly.
* CSV, DataFrame and Parquet have one row per request: the fixed ``ROW_COLUMNS`` and then one
  ``stage_<name>_ms`` column per stage (exclusive time, empty when the request had no such
  stage), in path order; then, when any request has a ``TCP_INFO`` reading, the ``TCP_COLUMNS``
  from its end reading (empty for requests without one). The CSV's first line is a ``#``
  comment with the version stamp (``pandas.read_csv(path, skiprows=1)``); a DataFrame
  carries it in ``df.attrs``; a Parquet file in its schema metadata under
  ``latency_analyzer``.

pandas (``latency-analyzer[dataframe]``) and pyarrow (``[parquet]``) load on first use.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from ..analysis import Tags, WaterfallSet
from ..errors import UsageError
from ..timeline import CLIENT_STAGES, RESIDUALS, SERVER_STAGES, Waterfall
from ._common import export_meta, scrub

__all__ = [
    "ROW_COLUMNS",
    "TCP_COLUMNS",
    "read_jsonl",
    "rows",
    "to_csv",
    "to_dataframe",
    "write_csv",
    "write_jsonl",
    "write_parquet",
]

#: The fixed columns of a CSV / DataFrame row, before the per-stage columns.
ROW_COLUMNS = (
    "start_epoch_ns",
    "method",
    "url",
    "status",
    "http_version",
    "ok",
    "error_type",
    "e2e_ms",
    "ttft_ms",
    "tpot_ms",
    "output_tokens",
    "input_tokens",
    "connection_reused",
    "tls_version",
    "tls_alpn",
    "tls_session_reused",
    "server_status",
    "ttfc_ms",
    "ttft_wire_ms",
    "clock_source",
    "read_lag_p50_ms",
    "read_lag_max_ms",
)
#: The kernel's view of each request's connection at its end (``wf.tcp_end``), after the stages.
TCP_COLUMNS = ("tcp_rtt_ms", "tcp_min_rtt_ms", "tcp_total_retrans", "tcp_lost", "tcp_snd_cwnd")
_STAGE_ORDER = tuple(dict.fromkeys((*CLIENT_STAGES, *SERVER_STAGES, *RESIDUALS)))


def _require(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise UsageError(
            f"{module} is not installed: pip install 'latency-analyzer[{extra}]'"
        ) from exc


# -- JSONL ------------------------------------------------------------------------------------
def write_jsonl(
    waterfalls: Iterable[Waterfall], path: str | Path, *, created: datetime | None = None
) -> Path:
    """Write the waterfalls (secrets scrubbed) as a WaterfallSet JSONL file; returns the path."""
    meta = {"export": export_meta("jsonl", created)}
    with WaterfallSet(path=path, meta=meta) as ws:
        for wf in waterfalls:
            ws.add(scrub(wf), Tags())
    return Path(path)


def read_jsonl(path: str | Path) -> list[Waterfall]:
    """The waterfalls of a JSONL file written by ``write_jsonl`` (or a load run), in order.

    Raises:
        UsageError: the file is not a WaterfallSet JSONL file.
    """
    out: list[Waterfall] = []
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f):
            obj = json.loads(line)
            if number == 0 and obj.get("kind") != "run":
                raise UsageError(f"{path}: not a latency_analyzer JSONL file")
            if obj.get("kind") == "wf":
                out.append(Waterfall.from_dict(obj["wf"]))
    return out


# -- rows -------------------------------------------------------------------------------------
def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 6)


def _row(wf: Waterfall) -> dict[str, Any]:
    tls = wf.tls
    row: dict[str, Any] = {
        "start_epoch_ns": wf.start_epoch_ns,
        "method": wf.method,
        "url": wf.url,
        "status": wf.status,
        "http_version": wf.http_version,
        "ok": wf.ok,
        "error_type": wf.error_type,
        "e2e_ms": _ms(wf.e2e),
        "ttft_ms": _ms(wf.ttft),
        "tpot_ms": _ms(wf.tpot),
        "output_tokens": wf.output_tokens,
        "input_tokens": wf.input_tokens,
        "connection_reused": wf.connection.reused,
        "tls_version": None if tls is None else tls.version,
        "tls_alpn": None if tls is None else tls.alpn,
        "tls_session_reused": None if tls is None else tls.session_reused,
        "server_status": wf.attributes.get("server.status"),
        "ttfc_ms": _ms(wf.ttfc),
        "ttft_wire_ms": _ms(wf.ttft_wire),
        "clock_source": wf.clock_source,
        "read_lag_p50_ms": _ms(wf.read_lag_p50),
        "read_lag_max_ms": _ms(wf.read_lag_max),
    }
    for stage, ns in wf.attribution_ns().items():
        row[f"stage_{stage}_ms"] = round(ns / 1e6, 6)
    tcp = wf.tcp_end
    if tcp is not None:
        min_rtt = None if tcp.min_rtt_us is None else tcp.min_rtt_us / 1e3
        row.update(
            zip(
                TCP_COLUMNS,
                (tcp.rtt_us / 1e3, min_rtt, tcp.total_retrans, tcp.lost, tcp.snd_cwnd),
                strict=True,
            )
        )
    return row


def rows(waterfalls: Iterable[Waterfall]) -> tuple[list[str], list[dict[str, Any]]]:
    """(column names, one dict per request): the shared shape of CSV, DataFrame and Parquet."""
    data = [_row(scrub(wf)) for wf in waterfalls]
    seen = {k for r in data for k in r if k.startswith("stage_")}
    rank = {f"stage_{s}_ms": i for i, s in enumerate(_STAGE_ORDER)}
    stages = sorted(seen, key=lambda k: (rank.get(k, len(rank)), k))
    tcp = list(TCP_COLUMNS) if any(TCP_COLUMNS[0] in r for r in data) else []
    return [*ROW_COLUMNS, *stages, *tcp], data


# -- CSV --------------------------------------------------------------------------------------
def _stamp_line(fmt: str, created: datetime | None) -> str:
    meta = export_meta(fmt, created)
    return "# " + " ".join(f"{k}={v}" for k, v in meta.items())


def to_csv(waterfalls: Iterable[Waterfall], *, created: datetime | None = None) -> str:
    """CSV text: a ``#`` version line, a header, one row per request (empty = not applicable)."""
    columns, data = rows(waterfalls)
    buf = io.StringIO()
    buf.write(_stamp_line("csv", created) + "\n")
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in data:
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def write_csv(
    waterfalls: Iterable[Waterfall], path: str | Path, *, created: datetime | None = None
) -> Path:
    """Write ``to_csv`` to ``path``; returns the path."""
    out = Path(path)
    out.write_text(to_csv(waterfalls, created=created), encoding="utf-8")
    return out


# -- pandas / Parquet -------------------------------------------------------------------------
def to_dataframe(waterfalls: Iterable[Waterfall], *, created: datetime | None = None) -> Any:
    """A pandas DataFrame, one row per request; ``df.attrs["latency_analyzer"]`` is the stamp.

    Raises:
        UsageError: pandas is not installed.
    """
    pd = _require("pandas", "dataframe")
    columns, data = rows(waterfalls)
    df = pd.DataFrame(data, columns=columns)
    df.attrs["latency_analyzer"] = export_meta("dataframe", created)
    return df


def write_parquet(
    waterfalls: Iterable[Waterfall], path: str | Path, *, created: datetime | None = None
) -> Path:
    """Write the DataFrame to Parquet, the stamp in the schema metadata; returns the path.

    Raises:
        UsageError: pandas or pyarrow is not installed.
    """
    pa = _require("pyarrow", "parquet")
    pq = _require("pyarrow.parquet", "parquet")
    df = to_dataframe(waterfalls, created=created)
    table = pa.Table.from_pandas(df, preserve_index=False)
    stamp = json.dumps(export_meta("parquet", created)).encode()
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), b"latency_analyzer": stamp}
    )
    pq.write_table(table, str(path))
    return Path(path)
