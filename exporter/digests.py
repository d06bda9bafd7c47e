"""SHA-256 of an artifact's files, hashed in a background thread from the moment they are final.

hashlib releases the GIL while it hashes, so the hashing runs on another core beside the steps
that wait on the runtime worker, and the report's digests are ready when it is written.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path


class Digests:
    """SHA-256 of `paths`, each started now in a daemon thread (an interrupted run does not wait
    for it). A file that changed since (size or modification time) is hashed again when asked."""

    def __init__(self, paths: Iterable[Path]):
        self._started: dict[Path, tuple[tuple[int, int], Future]] = {}
        for path in map(Path, paths):
            future: Future = Future()
            self._started[path] = (_stamp(path), future)
            threading.Thread(target=_hash_into, args=(path, future), daemon=True,
                             name=f"exportgate-sha256-{path.name}").start()

    def sha256(self, path: Path) -> str:
        started = self._started.get(Path(path))
        if started is not None and started[0] == _stamp(path):
            return started[1].result()
        return sha256(path)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _hash_into(path: Path, future: Future) -> None:
    try:
        future.set_result(sha256(path))
    except BaseException as exc:  # noqa: BLE001 - raised where the digest is asked for
        future.set_exception(exc)


def _stamp(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns
