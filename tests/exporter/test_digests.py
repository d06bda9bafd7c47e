"""SHA-256 of artifact files, hashed in the background from when they are final."""

import hashlib
import os

from exporter.digests import Digests


def test_digests_are_the_files_sha256_and_follow_a_file_that_changed_since(tmp_path):
    first, second = tmp_path / "m.onnx", tmp_path / "m.onnx.data"
    first.write_bytes(os.urandom(3 << 20))
    second.write_bytes(os.urandom(1 << 20))
    digests = Digests([first, second])
    assert digests.sha256(first) == hashlib.sha256(first.read_bytes()).hexdigest()
    assert digests.sha256(second) == hashlib.sha256(second.read_bytes()).hexdigest()
    second.write_bytes(b"rewritten after the hashing started")
    assert digests.sha256(second) == hashlib.sha256(b"rewritten after the hashing started").hexdigest()
    other = tmp_path / "other.bin"
    other.write_bytes(b"never started")
    assert digests.sha256(other) == hashlib.sha256(b"never started").hexdigest()


def test_a_hash_started_ahead_is_taken_while_the_file_stays_as_it_was(tmp_path):
    from exporter import digests as module

    kept, changed = tmp_path / "kept.onnx", tmp_path / "changed.onnx"
    kept.write_bytes(os.urandom(2 << 20))
    changed.write_bytes(os.urandom(2 << 20))
    module.hash_ahead(kept)
    module.hash_ahead(changed)
    module.hash_ahead(tmp_path / "missing.onnx")  # nothing to hash: the command reports it
    changed.write_bytes(b"rewritten before anything asked for its digest")
    digests = Digests([kept, changed])
    # both taken (a later Digests starts its own), and nothing kept for the missing file
    assert not {kept, changed, tmp_path / "missing.onnx"} & set(module._AHEAD)
    assert digests.sha256(kept) == hashlib.sha256(kept.read_bytes()).hexdigest()
    assert digests.sha256(changed) == hashlib.sha256(b"rewritten before anything asked for its digest").hexdigest()


def test_a_file_hashed_in_many_blocks_or_empty_has_its_sha256(tmp_path, monkeypatch):
    from exporter import digests as module

    monkeypatch.setattr(module, "_BLOCK", 1 << 16)  # 64 KiB blocks: many, and a short last one
    data = tmp_path / "m.onnx.data"
    data.write_bytes(os.urandom((3 << 20) + 7))
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    assert module.sha256(data) == hashlib.sha256(data.read_bytes()).hexdigest()
    assert module.sha256(empty) == hashlib.sha256(b"").hexdigest()
