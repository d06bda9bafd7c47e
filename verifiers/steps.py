"""One runner for every command: a command is a short list of named steps over its own state.

`run_steps` runs them in order, each announced on the progress callback and timed into the
report under its name, and guarantees that every way out leaves a report whose verdict and exit
code are the run's own: an ExportgateError becomes its finding and ends the run (with
EXPORTGATE_DEBUG set, its traceback in the finding's data); an interrupt
(SIGINT, SIGTERM) or an unforeseen error becomes a finding too and is raised again. Then the
clean-ups the steps pushed on `state.cleanups` run (they see the findings), and last the report
is written by every writer asked for (verifiers.writers).
"""

from __future__ import annotations

import contextlib
import os
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verifiers.errors import BadInput, ExportgateError, Terminated, one_line
from verifiers.report import Report
from verifiers.writers import write_reports

Progress = Callable[[str], None]  # takes each step's message; may also have count(what, done, total)


def silent(_: str) -> None:
    pass


def count(progress: Progress, what: str, done: int, total: int) -> None:
    """Tell a progress callback that shows counts (one with a `count` method) how far a step is:
    `done` of `total` batches, GELU probes."""
    counter = getattr(progress, "count", None)
    if counter is not None:
        counter(what, done, total)


@dataclass(frozen=True)
class Step:
    """`run(state)` does the work; `message(state)` is its progress line (None: it says nothing);
    `when(state)` false skips it; `timed` false leaves the timing to the step (it times its parts)."""

    name: str
    run: Callable[[Any], None]
    message: Callable[[Any], str | None] | None = None
    when: Callable[[Any], bool] | None = None
    timed: bool = True


def run_steps(report: Report, steps: Sequence[Step], state: Any, progress: Progress = silent,
              reports: dict[str, Path] | None = None) -> Report:
    """Run `steps` on `state` (which must have a `cleanups` ExitStack slot) and write the report
    to `reports` (writer name -> path)."""
    reports = {name: Path(path) for name, path in (reports or {}).items()}
    try:
        with contextlib.ExitStack() as stack:
            state.cleanups = stack
            try:
                for step in steps:
                    if step.when is not None and not step.when(state):
                        continue
                    message = step.message(state) if step.message is not None else None
                    if message:
                        progress(message)
                    with report.timed(step.name) if step.timed else contextlib.nullcontext():
                        step.run(state)
            except ExportgateError as exc:
                finding = report.fail(exc.kind, str(exc))
                if os.environ.get("EXPORTGATE_DEBUG"):  # the CLI prints it
                    finding.data["traceback"] = "".join(traceback.format_exception(exc))
            except KeyboardInterrupt:
                report.fail("interrupted", "interrupted (SIGINT): nothing was published")
                raise
            except Terminated:
                report.fail("terminated", "terminated (SIGTERM): nothing was published")
                raise
            except Exception as exc:
                report.fail("internal", f"internal error: {one_line(exc)}")
                raise
    finally:
        write_final(report, reports)
    return report


def write_final(report: Report, reports: dict[str, Path]) -> None:
    """Write the report; a file that cannot be written is a finding of its own (said once)."""
    try:
        write_reports(report, reports)
    except BadInput as exc:
        if all(f.message != str(exc) for f in report.failures):
            report.fail("input", str(exc))
