"""Report writers, found by name in a lazy registry: each writes a Report to a file.

A writer is a module with `write(report, path)` and `write_jobs([(job name, report), ...], path)`
(`exportgate run` and `merge`), which write atomically (a reader never sees half a report), and
`OPTION` and `HELP`, the command-line option that asks for it (exporter.options makes it an option of
every command that writes reports; errors name it). A new writer is that module and one line in
WRITERS; the API takes it as `reports={name: path}`, the CLI as its OPTION.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from verifiers.errors import BadInput, one_line
from verifiers.registry import LazyRegistry

if TYPE_CHECKING:
    from verifiers.report import Report

WRITERS: LazyRegistry[ModuleType] = LazyRegistry("report writer", {
    "json": "verifiers.writers.json_report",
    "junit": "verifiers.writers.junit_report",
    "html": "verifiers.writers.html_report",
    "summary": "verifiers.writers.markdown_summary",
})


def job_name(report: "Report") -> str:
    """The job a single command's report is about: the artifact it made or checked, else the model."""
    return (report.artifact.path if report.artifact else None) or report.model or report.command


def option_of(name: str) -> str:
    """The command-line option that asks for writer `name`."""
    return WRITERS.get_or_fail(name, "reports=").OPTION


def check_reports(paths: dict[str, Path]) -> None:
    """Refuse, before any work, an unknown writer or a report file the run could not write."""
    for name, path in paths.items():
        check_writable(path, option_of(name))


def write_reports(report: "Report", paths: dict[str, Path]) -> None:
    """Write the report with every writer asked for (writer name -> path); BadInput naming the
    option when a file cannot be written."""
    _write_each(paths, lambda writer, path: writer.write(report, path))


def write_job_reports(jobs: list[tuple[str, "Report"]], paths: dict[str, Path]) -> None:
    """Write several jobs' reports (job name, report) into one file per writer asked for."""
    _write_each(paths, lambda writer, path: writer.write_jobs(jobs, path))


def _write_each(paths: dict[str, Path], write) -> None:
    for name, path in paths.items():
        option = option_of(name)
        check_writable(path, option)
        try:
            write(WRITERS[name], Path(path))
        except OSError as exc:
            raise BadInput(f"{option} {path}: cannot write it: {one_line(exc)}") from exc


def check_writable(path: str | Path, option: str) -> None:
    """Refuse, before any work, a file path the run could not write: a folder, a path under a
    file, or a folder this process may not write to (read-only filesystem included)."""
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{option} {path}: is a folder; give a file path")
    ancestor = path.parent
    while not ancestor.exists():
        if ancestor == ancestor.parent:
            break
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise BadInput(f"{option} {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise BadInput(f"{option} {path}: {ancestor} is not writable")


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it and a rename."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
