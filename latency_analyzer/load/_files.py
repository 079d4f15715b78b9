"""Scenario files: TOML read into a :class:`Scenario`, a preset started from when named.

Apart from the model (:mod:`._scenario`) because a file may name a preset, and presets are
built on the runner: the model itself imports neither.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ._datasets import resolve_paths
from ._lengths import resolve_length_paths
from ._presets import preset_scenario
from ._scenario import Scenario, kind_of

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser from PyPI
    import tomli as tomllib

__all__ = ["load_scenario", "scenario_preset"]


def load_scenario(path: str | Path, **overrides: Any) -> tuple[Scenario, dict[str, Sequence[Any]]]:
    """Read a scenario TOML file; returns the scenario and its ``[sweep]`` table (may be empty).

    A ``preset = "NAME"`` key starts from that preset (its other keys override it).

    Raises:
        UsageError: the file is not UTF-8 or not TOML, or a key is unknown, missing or holds a
            bad value; the message starts with the file's name.
        OSError: the file cannot be read.
    """
    raw = Path(path).read_bytes()
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        reason = f"not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line})"
        raise UsageError(f"{path}: {reason}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML: {exc}") from None
    try:
        resolve_paths(data, Path(path).parent)
        resolve_length_paths(data, Path(path).parent)
        return _from_table(data, overrides)
    except UsageError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _from_table(
    data: dict[str, Any], overrides: Mapping[str, Any]
) -> tuple[Scenario, dict[str, Sequence[Any]]]:
    data.update({k: v for k, v in overrides.items() if v is not None})
    sweep = data.pop("sweep", {})
    if not isinstance(sweep, Mapping):
        raise UsageError(f"key 'sweep': expected a table, got {kind_of(sweep)}")
    preset = data.pop("preset", None)
    if preset is not None:
        if not isinstance(preset, str):
            raise UsageError(f"key 'preset': expected a string, got {kind_of(preset)}")
        return preset_scenario(preset, **data), dict(sweep)
    return Scenario.from_dict(data), dict(sweep)


def scenario_preset(path: str | Path) -> str | None:
    """The ``preset = "NAME"`` of a scenario file, or None (no preset, or not readable TOML:
    :func:`load_scenario` says what is wrong with it)."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    preset = data.get("preset")
    return preset if isinstance(preset, str) else None
