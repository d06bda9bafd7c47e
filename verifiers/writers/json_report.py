"""The JSON report: every field of the Report, with its verdict and exit code first (for several
jobs: their combined verdict and exit code, then each job's report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verifiers.report import Report, combined_exit_code
from verifiers.writers import atomic_write

OPTION = "--report"
HELP = "Write the JSON report here."


def write(report: Report, path: Path) -> None:
    atomic_write(path, json.dumps(report.to_dict(), indent=2, default=_json_default) + "\n")


def write_jobs(jobs: list[tuple[str, Report]], path: Path) -> None:
    """Several jobs' reports in one: the combined verdict and exit code, then each job's report."""
    code = combined_exit_code(report.exit_code for _, report in jobs)
    body = {"verdict": "pass" if code == 0 else "fail", "exit_code": code,
            "jobs": [{"job": name, **report.to_dict()} for name, report in jobs]}
    atomic_write(path, json.dumps(body, indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")
