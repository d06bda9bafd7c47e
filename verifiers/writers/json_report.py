"""The JSON report: every field of the Report, with its verdict and exit code first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verifiers.report import Report
from verifiers.writers import atomic_write

OPTION = "--report"


def write(report: Report, path: Path) -> None:
    atomic_write(path, json.dumps(report.to_dict(), indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")
