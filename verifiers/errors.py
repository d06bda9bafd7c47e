"""Errors that end a run early, each with the finding kind it becomes in the report, and how an
error is told in one line (with the line of the user's own code that raised it)."""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import traceback
from pathlib import Path


class ExportgateError(Exception):
    """A failure with a finding kind ("input", "opset", "target", "numeric", "gelu"), and the
    option it is about (its name in exporter.options), where one is to blame."""

    kind = "input"
    option: str | None = None

    def __init__(self, message: str, kind: str | None = None, option: str | None = None):
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        if option is not None:
            self.option = option

    def __reduce__(self):
        # Pickled (from a runtime worker) with its kind, whatever the subclass's __init__ takes.
        return _rebuild, (type(self), str(self), self.kind, self.option)


def _rebuild(cls: type[ExportgateError], message: str, kind: str, option: str | None = None) -> ExportgateError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.kind = kind
    error.option = option
    return error


@contextlib.contextmanager
def about(option: str):
    """An error raised inside, that names no option yet, is about `option`."""
    try:
        yield
    except ExportgateError as exc:
        if exc.option is None:
            exc.option = option
        raise


class BadInput(ExportgateError):
    """Unreadable model, bad spec, missing callable: exit 2."""

    kind = "input"


class MissingFramework(BadInput):
    """A framework the request needs is not installed: exit 2 with the pip command that fixes it."""

    def __init__(self, module: str, extra: str):
        super().__init__(
            f"{module} is not installed; install it with: pip install 'exportgate[{extra}]'"
        )
        self.module = module
        self.extra = extra


class Incompatible(ExportgateError):
    """The request cannot be honoured at this opset or for this target: exit 4."""

    kind = "target"


class Terminated(BaseException):
    """Raised in the main thread when the process gets SIGTERM, so the run unwinds, cleans up and
    writes its report as it does on Ctrl-C (KeyboardInterrupt)."""


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`, for one-line error reports."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__


def _library_folders() -> tuple[str, ...]:
    """Where code that is not the user's lives: the standard library, installed packages, and
    exportgate's own packages."""
    paths = sysconfig.get_paths()
    here = Path(__file__).resolve().parent.parent
    folders = {paths.get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    folders |= {str(here / "exporter"), str(here / "verifiers"), sys.prefix, sys.base_prefix}
    return tuple(str(Path(folder).resolve()) + os.sep for folder in folders if folder)


def user_frame(exc: BaseException) -> str | None:
    """`file:line` of the innermost frame of `exc`'s traceback in the user's own files (neither
    the standard library, an installed package nor exportgate), the path relative to the working
    directory when it is under it; None when no frame is the user's."""
    libraries = _library_folders()
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if not path.is_absolute() or not path.is_file():  # <string>, frozen modules
            continue
        resolved = str(path.resolve())
        if not resolved.startswith(libraries):
            found = (path.resolve(), frame.lineno)
    if found is None:
        return None
    path, line = found
    try:
        path = path.relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return f"{path}:{line}"


def raised(exc: BaseException) -> str:
    """one_line(exc), and where the user's code raised it (user_frame) when it did."""
    where = user_frame(exc)
    return one_line(exc) + (f" (at {where})" if where else "")
