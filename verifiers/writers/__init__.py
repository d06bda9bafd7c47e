"""Report writers, found by name in a lazy registry: each writes a Report to a file.

A writer is a module with `write(report, path)` that writes atomically (a reader never sees half
a report). The CLI option that asks for one (`--report` for JSON) and one line in WRITERS are all
a new writer needs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from verifiers.errors import BadInput, one_line
from verifiers.registry import LazyRegistry

if TYPE_CHECKING:
    from verifiers.report import Report

WRITERS: LazyRegistry[Callable[["Report", Path], None]] = LazyRegistry("report writer", {
    "json": "verifiers.writers.json_report:write",
})
# The command-line option that asks for each writer's file, for errors.
OPTIONS = {"json": "--report"}


def write_reports(report: "Report", paths: dict[str, Path]) -> None:
    """Write the report with every writer asked for (writer name -> path); BadInput naming the
    option when a file cannot be written."""
    for name, path in paths.items():
        option = OPTIONS.get(name, name)
        check_writable(path, option)
        try:
            WRITERS[name](report, Path(path))
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
