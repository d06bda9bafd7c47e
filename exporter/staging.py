"""Nothing half-written: artifacts are built in a staging folder beside --out, then published whole or
kept under a name no pipeline could mistake for the release file."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from exporter.errors import ExportgateError
from verifiers.onnx_model import (
    external_data_files,
    load_structure,
    relocate_external_data,
)

REJECTED_SUFFIX = ".rejected"


def companion_files(path: Path, fmt: str) -> list[str]:
    """Files that travel with an artifact (ONNX external data), relative to its folder."""
    if fmt != "onnx" or not path.exists():
        return []
    try:
        return external_data_files(load_structure(path))
    except ExportgateError:
        return []


def remove_artifact(path: Path, fmt: str) -> bool:
    """Remove an artifact and its companion files; True when there was one."""
    if not path.exists():
        return False
    for name in companion_files(path, fmt):
        (path.parent / name).unlink(missing_ok=True)
    path.unlink()
    return True


class Staging:
    """A private folder on the same filesystem as --out, so publishing is a rename."""

    def __init__(self, out: Path, fmt: str):
        self.out = Path(out)
        self.format = fmt
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.folder = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".staging", dir=self.out.parent))
        self.path = self.folder / self.out.name

    def keep_copy(self, name: str) -> Path:
        """A copy of the staged artifact (and its companions) in a sub-folder, e.g. to verify the
        export as it was before a rewrite."""
        folder = self.folder / name
        folder.mkdir()
        for file in [self.out.name, *companion_files(self.path, self.format)]:
            shutil.copy2(self.folder / file, folder / file)
        return folder / self.out.name

    def publish(self) -> Path:
        """Move the artifact to --out, companions first so the model never names a missing file."""
        for name in companion_files(self.path, self.format):
            os.replace(self.folder / name, self.out.parent / name)
        os.replace(self.path, self.out)
        return self.out

    def reject(self, folder: Path) -> Path:
        """Keep the artifact as NAME.rejected (companions renamed to match) in `folder`."""
        folder.mkdir(parents=True, exist_ok=True)
        rejected = folder / (self.out.name + REJECTED_SUFFIX)
        remove_artifact(rejected, self.format)
        renames = {}
        for name in companion_files(self.path, self.format):
            stem = self.out.name
            renames[name] = rejected.name + (name[len(stem):] if name.startswith(stem) else f".{name}")
        if renames:
            relocate_external_data(self.path, renames)
            for old, new in renames.items():
                shutil.move(self.folder / old, folder / new)
        shutil.move(self.path, rejected)
        return rejected

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
