"""What a report records of an artifact: its format and facts, and its files' paths, SHA-256 and
sizes (hashed in the background while the run goes on)."""

from __future__ import annotations

from pathlib import Path

from exporter.digests import Digests, sha256
from verifiers.errors import one_line
from verifiers.formats import Artifact
from verifiers.report import ArtifactInfo, Report


def record_artifact(report: Report, artifact: Artifact) -> None:
    """The artifact's format and the facts its format reads (opsets, ops, precision...)."""
    report.format = artifact.format.name
    artifact.record_facts(report)


def hash_in_background(artifact: Artifact) -> Digests:
    """Start hashing the artifact's files: they are final from here on."""
    return Digests([artifact.path, *(artifact.path.parent / name for name in artifact.companion_files())])


def report_artifact(report: Report, artifact: Artifact, digests: Digests) -> None:
    """report.artifact from the digests hashed in the background (a clean-up: a file that could not
    be read is a finding)."""
    try:
        report.artifact = artifact_info(artifact, digests=digests)
    except OSError as exc:
        report.fail("input", f"{artifact.path}: could not be read to hash it: {one_line(exc)}")


def artifact_info(artifact: Artifact, published_as: Path | None = None, digests: Digests | None = None) -> ArtifactInfo:
    """Path, hashes and sizes of an artifact and its data files (refusing data files it may not
    name); `published_as` is where it will stand once published (the same names beside it);
    `digests`, when the hashing started earlier."""
    path = artifact.path
    hashed = digests.sha256 if digests is not None else sha256
    shown = Path(published_as) if published_as is not None else path
    data_files = [
        {"path": str(shown.parent / name), "sha256": hashed(path.parent / name),
         "size_bytes": (path.parent / name).stat().st_size}
        for name in artifact.companion_files()
    ]
    return ArtifactInfo(str(shown), artifact.format.name, hashed(path), path.stat().st_size, data_files)
