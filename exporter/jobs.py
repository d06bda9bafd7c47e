"""Running a config's jobs: a slice of them (--only, --shard), each an `exportgate export` in a worker
process of its own, into its own folder, or reused from a content-addressed cache.

    OUT_DIR/bert/onnx17/bert.onnx      the artifact (published only when the job passes)
    OUT_DIR/bert/onnx17/report.json    the job's report (read back by `merge`)
    OUT_DIR/bert/onnx17/log.txt        what the job printed

A job's crash or timeout is that job's failure (a report says so), not the run's. A job whose
inputs did not change (its options, the model's files, the target matrix, exportgate's code, the
frameworks' versions; and, checked on restore, every file its report lists as read while the
model loaded, and the cached artifact itself) is restored from the cache instead of exported
again; its report says it was reused and when the reused result was made. Only results that say something about the
artifact are kept (a pass, or outputs, GELU or target that fail), not bad input, crashes or
interrupts, which may not happen again.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from exporter.config import Job, files_digest
from exporter.digests import sha256
from exporter.options import job_argv, worker_argv
from verifiers.errors import BadInput
from verifiers.report import Report, library_versions
from verifiers.target_matrix import packaged_matrix_path
from verifiers.writers import json_report

REPORT_FILE = "report.json"
LOG_FILE = "log.txt"
# Findings that say something about the artifact, the same again for the same inputs: cacheable.
_CACHEABLE_KINDS = {"numeric", "gelu", "gelu_guard", "opset", "target"}
class JobProgress(Protocol):
    """What a run tells of its jobs: the job's id, what it is doing, and whether that ends it."""

    def __call__(self, job: str, message: str, done: bool = False) -> None: ...


_STEP_LINE = re.compile(r"^exportgate: \d\d:\d\d:\d\d (.+)$")  # an export's progress line in a log


@dataclass
class JobResult:
    job: Job
    report: Report
    folder: Path
    seconds: float
    reused: bool = False


def select(jobs: list[Job], only: list[str] = (), shard: str | None = None) -> list[Job]:
    """The jobs named by --only, or shard I of N (1-based; jobs dealt round-robin in id order)."""
    if only:
        known = {job.id: job for job in jobs}
        unknown = [name for name in only if name not in known]
        if unknown:
            raise BadInput(f"--only {unknown[0]}: no such job (jobs: {', '.join(known)})")
        return [known[name] for name in dict.fromkeys(only)]
    if shard is None:
        return list(jobs)
    index, _, count = shard.partition("/")
    if not (index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count)):
        raise BadInput(f"--shard {shard!r}: expected I/N with 1 <= I <= N, e.g. 1/2")
    return [job for k, job in enumerate(jobs) if k % int(count) == int(index) - 1]


def job_folder(out_dir: Path, job: Job) -> Path:
    return Path(out_dir) / job.id


class StaleEntry(Exception):
    """A cache entry whose artifact, or a file its model was built from, changed after it was stored."""


class JobCache:
    """Job results by the digest of everything they depend on, one folder each."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def key(self, job: Job, limits: dict) -> str:
        inputs = {
            "job": job.id, "model": job.model, "options": job.options, "limits": limits,
            "files": files_digest(job.files),
            "matrix": files_digest((job.matrix,)) if job.matrix else None,
            "versions": library_versions(), "python": sys.version,
            "exportgate": code_digest(Path(__file__).parent.parent),
        }
        return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()

    def restore(self, key: str, folder: Path) -> Report | None:
        """The cached result put in `folder` (which it replaces whole), its report saying so; None
        when there is none. StaleEntry when a file the model was built from or the artifact no
        longer hashes to what the report records (the entry is dropped: the job must run again)."""
        entry = self.folder / key
        meta = entry / "cache.json"
        if not meta.is_file():
            return None
        made = json.loads(meta.read_text())["made"]
        report = Report.from_dict(json.loads((entry / REPORT_FILE).read_text()))
        changed = _changed_source_file(report)
        if changed is not None:
            shutil.rmtree(entry, ignore_errors=True)
            raise StaleEntry(f"{changed}, which the model was built from, changed since the run made {made}: "
                             "exported again")
        if not _artifact_intact(report, entry):
            shutil.rmtree(entry, ignore_errors=True)
            raise StaleEntry(f"the cached artifact of the run made {made} changed since (its SHA-256 is not "
                             "the report's): exported again")
        report.reused = {"key": key, "made": made}
        report.notes.append(f"reused from the cache: the inputs are those of a run made {made} (key {key[:12]})")
        _relocate(report, folder)
        staged = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".restore", dir=_parent(folder)))
        linked = _artifact_files(report)
        for item in entry.iterdir():
            if item.name not in ("cache.json", REPORT_FILE):
                (_link_or_copy if item.name in linked else shutil.copy2)(item, staged / item.name)
        json_report.write(report, staged / REPORT_FILE)
        _replace_folder(staged, folder)
        return report

    def store(self, key: str, folder: Path, report: Report) -> None:
        if not report_is_cacheable(report):
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{key[:12]}.", dir=self.folder))
        linked = _artifact_files(report)
        for item in folder.iterdir():
            if item.is_file():
                (_link_or_copy if item.name in linked else shutil.copy2)(item, staged / item.name)
        made = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        (staged / "cache.json").write_text(json.dumps({"made": made, "job": report.model}) + "\n")
        try:
            os.replace(staged, self.folder / key)
        except OSError:  # another run stored the same key meanwhile: theirs stands
            shutil.rmtree(staged, ignore_errors=True)


@functools.cache
def code_digest(root: Path) -> str:
    """SHA-256 of exportgate's code under `root` (exporter/ and verifiers/, sources only) and of its
    target matrix: a result made by other code is not reused, whatever the version string says
    (a source checkout changes under the same one)."""
    sources = sorted(p for package in ("exporter", "verifiers") for p in (root / package).rglob("*.py"))
    return files_digest((*sources, packaged_matrix_path()))


def _artifact_files(report: Report) -> dict[str, str]:
    """The names of a report's artifact files, with the SHA-256 it records for each."""
    if report.artifact is None:
        return {}
    files = {Path(report.artifact.path).name: report.artifact.sha256}
    files.update((Path(data["path"]).name, data["sha256"]) for data in report.artifact.data_files)
    return files


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link where the file system allows one (an artifact of gigabytes costs no second
    copy), a copy otherwise. Artifacts are published by renaming, never written in place, and a
    restore checks their digests, so a linked file edited by hand is caught."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _changed_source_file(report: Report) -> Path | None:
    """The first file the source model was built from (the user's modules it imported, the files it
    read) that is gone or no longer hashes to what the report records, if any. The cache key
    covers the spec file and the config's `files`; these are what the load itself touched (a path
    relative to the working directory the job ran in, which is this run's, or absolute)."""
    return _first_changed((Path(recorded["path"]), recorded["sha256"]) for recorded in report.source_files)


def _artifact_intact(report: Report, entry: Path) -> bool:
    """Whether the artifact files of a cached report still hash to the digests it records."""
    return _first_changed((entry / name, digest) for name, digest in _artifact_files(report).items()) is None


def _first_changed(recorded: Iterable[tuple[Path, str]]) -> Path | None:
    """The first file that is gone or no longer has its recorded SHA-256."""
    for path, digest in recorded:
        try:
            if sha256(path) != digest:
                return path
        except OSError:
            return path
    return None


def report_is_cacheable(report: Report) -> bool:
    return report.reused is None and all(f.kind in _CACHEABLE_KINDS for f in report.failures)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "exportgate"


def run_jobs(jobs: list[Job], out_dir: Path, workers: int, cache: JobCache | None,
             progress: JobProgress, timeout: float | None = None, limits: dict | None = None) -> list[JobResult]:
    """Every job, `workers` at a time, results in the order of `jobs`."""
    limits = limits or {}
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="exportgate-job") as pool:
        futures = [pool.submit(_run_one, job, Path(out_dir), cache, progress, timeout, limits) for job in jobs]
        try:
            return [future.result() for future in futures]
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()
            _interrupt_children()
            raise


def _run_one(job: Job, out_dir: Path, cache: JobCache | None, progress: JobProgress, timeout: float | None,
             limits: dict) -> JobResult:
    folder = job_folder(out_dir, job)
    start = time.monotonic()
    key = cache.key(job, limits) if cache is not None else None
    stale = None
    if cache is not None:
        try:
            report = cache.restore(key, folder)
        except StaleEntry as entry:
            report, stale = None, str(entry)
            progress(job.id, stale)
        if report is not None:
            progress(job.id, f"reused from the cache ({report.reused['made']})", done=True)
            return JobResult(job, report, folder, time.monotonic() - start, reused=True)
    progress(job.id, "starting")
    report = _export(job, folder, progress, timeout, limits)
    if stale:
        report.notes.append(stale)
        json_report.write(report, folder / REPORT_FILE)
    if cache is not None:
        cache.store(key, folder, report)
    progress(job.id, f"{report.verdict} (exit {report.exit_code})", done=True)
    return JobResult(job, report, folder, time.monotonic() - start)


_CHILDREN: set[subprocess.Popen] = set()
_CHILDREN_LOCK = threading.Lock()


def _interrupt_children() -> None:
    with _CHILDREN_LOCK:
        for child in _CHILDREN:
            if child.poll() is None:
                child.send_signal(signal.SIGINT)


def export_arguments(job: Job, out: Path, report: Path, worker: dict) -> list[str]:
    """The `exportgate export` command line of a job, with the runtime worker's settings."""
    options = dict(job.options)
    args = ["export", job.model, "--out", str(out), "--report", str(report), *job_argv(options)]
    if job.matrix is not None:
        args += ["--matrix", str(job.matrix)]
    return args + worker_argv(worker)


def _export(job: Job, folder: Path, progress: JobProgress, timeout: float | None, limits: dict) -> Report:
    """`exportgate export` of the job in a worker interpreter; a report of its crash or timeout when
    it wrote none."""
    folder.mkdir(parents=True, exist_ok=True)
    report_path = folder / REPORT_FILE
    report_path.unlink(missing_ok=True)
    command = [sys.executable, "-c", "from exporter.cli import main; main()",
               *export_arguments(job, folder / job.artifact_name(), report_path, limits)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop("GITHUB_STEP_SUMMARY", None)  # the run writes one summary for all its jobs
    env.pop("GITHUB_ACTIONS", None)
    with open(folder / LOG_FILE, "w", encoding="utf-8") as log:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.PIPE, text=True,
                                 env=env)
        with _CHILDREN_LOCK:
            _CHILDREN.add(child)
        timer = threading.Timer(timeout, child.kill) if timeout else None
        if timer:
            timer.start()
        try:
            for line in child.stderr:
                log.write(line)
                step = _STEP_LINE.match(line)
                if step:
                    progress(job.id, step[1])
            code = child.wait()
        finally:
            if timer:
                timer.cancel()
            with _CHILDREN_LOCK:
                _CHILDREN.discard(child)
    if report_path.is_file():
        return Report.from_dict(json.loads(report_path.read_text()))
    report = Report(command="export", model=job.model, format=job.options["to"])
    if code < 0 and timeout and code == -signal.SIGKILL:
        report.fail("runtime", f"job {job.id} did not finish within {timeout:g} s (--job-timeout)")
    elif code < 0:
        report.fail("runtime", f"job {job.id} crashed ({signal.Signals(-code).name}); see {folder / LOG_FILE}")
    else:
        report.fail("internal", f"job {job.id} exited {code} without a report; see {folder / LOG_FILE}")
    json_report.write(report, report_path)
    return report


def _relocate(report: Report, folder: Path) -> None:
    """Point a restored report's paths at the folder it now lives in."""
    if report.artifact is not None:
        report.artifact.path = str(folder / Path(report.artifact.path).name)
        for data in report.artifact.data_files:
            data["path"] = str(folder / Path(data["path"]).name)
    if report.rejected_artifact:
        report.rejected_artifact = str(folder / Path(report.rejected_artifact).name)


def _parent(folder: Path) -> Path:
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder.parent


def _replace_folder(staged: Path, folder: Path) -> None:
    """Put `staged` where `folder` is, whole: the old folder is moved aside first, then removed."""
    old = None
    if folder.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".old", dir=folder.parent))
        os.replace(folder, old / folder.name)
    os.replace(staged, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
