"""Nothing half-written: artifacts are built in a staging folder beside --out, then published whole or
kept under a name no pipeline could mistake for the release file."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from verifiers.errors import ExportgateError
from verifiers.formats import FORMATS

REJECTED_SUFFIX = ".rejected"
STAGING_SUFFIX = ".staging"
OWNER_FILE = ".owner"  # in a staging folder: "PID START_TIME" of the run that made it


def companion_files(path: Path, fmt: str) -> list[str]:
    """Files that travel with an artifact (ONNX external data), relative to its folder. Raises
    BadInput when the artifact names data it may not (outside its folder, not a regular file,
    too short): see verifiers.onnx_model.check_external_data."""
    return FORMATS[fmt].open(path).companion_files() if path.exists() else []


def remove_artifact(path: Path, fmt: str) -> bool:
    """Remove an artifact and its companion files; True when there was one. Companions are
    removed only when the artifact names them safely: an unreadable or hostile file at `path`
    is removed alone, and nothing it names is touched."""
    if not path.exists() and not path.is_symlink():
        return False
    try:
        companions = companion_files(path, fmt)
    except ExportgateError:
        companions = []
    for name in companions:
        (path.parent / name).unlink(missing_ok=True)
    path.unlink()
    return True


def _process_start(pid: int) -> str:
    """When a process started (clock ticks since boot, from /proc), to tell it from a later
    process given the same pid; "" where /proc has no such process or no /proc exists."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _owner_alive(folder: Path) -> bool:
    try:
        pid_text, _, start = (folder / OWNER_FILE).read_text().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return not start.strip() or _process_start(pid) == start.strip()


def sweep_abandoned(folder: Path) -> list[Path]:
    """Remove the staging folders in `folder` whose run is gone (killed before it could clean
    up), so no unverified artifact outlives it; returns what was removed."""
    removed = []
    for staging in Path(folder).glob(f".*{glob.escape(STAGING_SUFFIX)}"):
        if staging.is_dir() and (staging / OWNER_FILE).exists() and not _owner_alive(staging):
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
    return removed


@contextlib.contextmanager
def out_lock(out: Path, progress: Callable[[str], None]) -> Iterator[None]:
    """One run at a time per --out: a second run waits for the first (and says so). The lock
    file lives in the temporary folder, keyed by --out's absolute path, so nothing is left beside
    the artifact."""
    import hashlib

    from filelock import FileLock, Timeout

    key = hashlib.sha256(str(Path(out).resolve()).encode()).hexdigest()[:32]
    folder = Path(tempfile.gettempdir()) / f"exportgate-locks-{os.getuid() if hasattr(os, 'getuid') else 0}"
    folder.mkdir(mode=0o700, exist_ok=True)
    lock = FileLock(str(folder / f"{key}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        progress(f"waiting for another exportgate run writing {out}")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


class Staging:
    """A private folder on the same filesystem as --out, so publishing is a rename. It records
    its owner, so a later run can sweep it if this one is killed."""

    def __init__(self, out: Path, fmt: str):
        self.out = Path(out)
        self.format = fmt
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=STAGING_SUFFIX, dir=self.out.parent))
        pid = os.getpid()
        (self.folder / OWNER_FILE).write_text(f"{pid} {_process_start(pid)}")
        self.path = self.folder / self.out.name

    def keep_copy(self, name: str) -> Path:
        """A copy of the staged artifact (and its companions) in a sub-folder, e.g. to verify the
        export as it was before a rewrite."""
        folder = self.folder / name
        folder.mkdir()
        for file in [self.out.name, *companion_files(self.path, self.format)]:
            shutil.copy2(self.folder / file, folder / file)
        return folder / self.out.name

    def publish(self, companions: list[str], beside: list[Path] = ()) -> Path:
        """Move the artifact to --out, its companion files (as the artifact lists them) and the
        files that travel with it (`beside`: copied in, then moved) first, so the model never names
        a missing file and nothing stands half-written beside it."""
        for file in beside:
            shutil.copyfile(file, self.folder / file.name)
        for name in [*companions, *(file.name for file in beside)]:
            os.replace(self.folder / name, self.out.parent / name)
        os.replace(self.path, self.out)
        return self.out

    def reject(self, folder: Path, companions: list[str]) -> Path:
        """Keep the artifact as NAME.rejected (its companion files renamed to match) in `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        rejected = folder / (self.out.name + REJECTED_SUFFIX)
        remove_artifact(rejected, self.format)
        renames = {}
        for name in companions:
            stem = self.out.name
            renames[name] = rejected.name + (name[len(stem):] if name.startswith(stem) else f".{name}")
        if renames:
            FORMATS[self.format].open(self.path).relocate_companions(renames)
            for old, new in renames.items():
                shutil.move(self.folder / old, folder / new)
        shutil.move(self.path, rejected)
        return rejected

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
