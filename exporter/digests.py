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
    for it) unless `hash_ahead` started it. A file that changed since (size or modification time)
    is hashed again when asked."""

    def __init__(self, paths: Iterable[Path]):
        self._started: dict[Path, tuple[tuple[int, int], Future]] = {}
        for path in map(Path, paths):
            ahead = _AHEAD.pop(path.resolve(), None)
            self._started[path] = ahead if ahead is not None and ahead[0] == _stamp(path) else _start(path)

    def sha256(self, path: Path) -> str:
        started = self._started.get(Path(path))
        if started is not None and started[0] == _stamp(path):
            return started[1].result()
        return sha256(path)


_AHEAD: dict[Path, tuple[tuple[int, int], Future]] = {}  # hash_ahead's, by resolved path


def hash_ahead(path: Path) -> None:
    """Start hashing a file now, before anything asks for its digest: the next Digests of it (same
    size and modification time) takes the hash under way. Nothing happens for a path that is not a
    regular file (the command reports that itself)."""
    path = Path(path)
    if path.is_file():
        _AHEAD[path.resolve()] = _start(path)


def _start(path: Path) -> tuple[tuple[int, int], Future]:
    future: Future = Future()
    stamp = _stamp(path)
    threading.Thread(target=_hash_into, args=(path, future), daemon=True, name=f"exportgate-sha256-{path.name}").start()
    return stamp, future


# Bytes read and hashed per call (see sha256).
_BLOCK = 4 << 20


def sha256(path: Path) -> str:
    """The file's SHA-256. Reading and hashing hold no GIL, but each block takes it back, and a
    background hash beside busy Python code waits up to a switch interval each time. For 435 MB,
    alone and beside a thread that never waits: 1 MiB blocks 0.33 s and 4.6 s, 4 MiB 0.35 s and
    1.4 s, 16 MiB 0.40 s and 0.70 s; `exportgate check` of that file took least with 4 MiB.
    (A memory map hashed in one call never waits, but a file truncated while mapped kills the
    process with SIGBUS, and the files hashed here may change while they are hashed.)"""
    digest = hashlib.sha256()
    block = bytearray(_BLOCK)
    with open(path, "rb", buffering=0) as fh, memoryview(block) as view:
        while read := fh.readinto(block):
            with view[:read] as part:
                digest.update(part)
    return digest.hexdigest()


def _hash_into(path: Path, future: Future) -> None:
    try:
        future.set_result(sha256(path))
    except BaseException as exc:  # noqa: BLE001 - raised where the digest is asked for
        future.set_exception(exc)


def _stamp(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns
