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
