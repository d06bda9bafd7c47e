"""The Python API of release pipelines: `run` a config's jobs (or a slice), `plan` them for a CI
system's matrix, `merge` the job folders that CI jobs uploaded. Each returns what the CLI prints or
writes; `run` and `merge` write the combined reports (JSON, JUnit, HTML, Markdown) asked for.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.config import load_config
from exporter.jobs import REPORT_FILE, JobCache, JobProgress, JobResult, default_cache_dir, run_jobs, select
from exporter.options import given
from verifiers.errors import BadInput, one_line
from verifiers.report import Report, combined_exit_code
from verifiers.writers import check_reports, write_job_reports

DEFAULT_OUT_DIR = "exportgate-out"


@dataclass
class RunResult:
    """The jobs of a run or a merge, in job id order, and what they add up to."""

    jobs: list[tuple[str, Report]]
    out_dir: Path | None = None
    reused: int = 0
    results: list[JobResult] | None = None

    @property
    def exit_code(self) -> int:
        return combined_exit_code(report.exit_code for _, report in self.jobs)

    def summary_lines(self) -> list[str]:
        lines = []
        for name, report in self.jobs:
            reused = f", reused from {report.reused['made']}" if report.reused else ""
            lines.append(f"{report.verdict.upper()} {name} (exit {report.exit_code}{reused})")
            lines += [f"  [{f.kind}] {f.message}" for f in report.failures]
        passed = sum(report.exit_code == 0 for _, report in self.jobs)
        lines.append(f"{passed} of {len(self.jobs)} job(s) pass" + (f"; {self.reused} reused from the cache"
                                                                   if self.reused else ""))
        return lines


def run(config: str | Path | None = None, *, out_dir: str | Path | None = None, workers: int | None = None,
        only: Sequence[str] = (), shard: str | None = None, cache: bool = True, cache_dir: str | Path | None = None,
        job_timeout: float | None = None, worker: Mapping[str, Any] | None = None,
        reports: Mapping[str, str | Path] | None = None, progress: JobProgress = lambda job, message, done=False: None,
        ) -> RunResult:
    """Run the config's jobs (those of --only or --shard), each in a worker process into
    OUT_DIR/JOB_ID, `workers` at a time (default: the cores), reusing cached results unless
    `cache` is False; `worker`: the runtime worker's settings every job gets (timeout,
    memory_limit, ... as exporter.options names them). The whole config is validated first: a
    bad field runs nothing (BadInput)."""
    paths = {name: Path(path) for name, path in (reports or {}).items()}
    check_reports(paths)
    loaded = load_config(config)
    jobs = select(loaded.jobs, list(only), shard)
    folder = Path(out_dir or loaded.out_dir or DEFAULT_OUT_DIR)
    limits = given("run", dict(worker or {}), to="worker")
    job_cache = JobCache(Path(cache_dir) if cache_dir else default_cache_dir()) if cache else None
    for job in jobs:
        progress(job.id, "waiting")
    results = run_jobs(jobs, folder, workers or os.cpu_count() or 1, job_cache, progress, job_timeout, limits)
    result = RunResult([(r.job.id, r.report) for r in results], folder, sum(r.reused for r in results), results)
    write_job_reports(result.jobs, paths)
    return result


def plan(config: str | Path | None = None, fmt: str = "json") -> dict:
    """The job matrix: {"jobs": [ids]}, or as GitHub Actions' strategy.matrix ({"include": [{"job":
    id}]}) or GitLab's parallel:matrix ({"parallel": {"matrix": [{"EXPORTGATE_JOB": [ids]}]}})."""
    ids = [job.id for job in load_config(config).jobs]
    formats = {
        "json": lambda: {"jobs": ids},
        "github": lambda: {"include": [{"job": job_id} for job_id in ids]},
        "gitlab": lambda: {"parallel": {"matrix": [{"EXPORTGATE_JOB": ids}]}},
    }
    if fmt not in formats:
        raise BadInput(f"--format {fmt!r}: choose one of {', '.join(formats)}")
    return formats[fmt]()


def merge(folders: Sequence[str | Path], *, reports: Mapping[str, str | Path] | None = None) -> RunResult:
    """The job reports found under `folders` (OUT_DIR folders of runs or shards: each
    JOB_ID/report.json), joined as one run and written to `reports`."""
    paths = {name: Path(path) for name, path in (reports or {}).items()}
    check_reports(paths)
    found: dict[str, tuple[Path, Report]] = {}
    for folder in map(Path, folders):
        if not folder.is_dir():
            raise BadInput(f"{folder}: no such folder")
        for report_file in sorted(folder.rglob(REPORT_FILE)):
            job_id = report_file.parent.relative_to(folder).as_posix()
            if job_id == ".":  # a run's own combined report, not a job's
                continue
            if job_id in found:
                raise BadInput(f"job {job_id} is in both {found[job_id][0]} and {report_file}")
            try:
                found[job_id] = report_file, Report.from_dict(json.loads(report_file.read_text()))
            except (ValueError, TypeError, OSError) as exc:
                raise BadInput(f"{report_file}: not an exportgate report: {one_line(exc)}") from exc
    if not found:
        raise BadInput(f"no job reports ({REPORT_FILE}) under {', '.join(map(str, folders))}")
    result = RunResult([(job_id, found[job_id][1]) for job_id in sorted(found)],
                       reused=sum(report.reused is not None for _, report in found.values()))
    write_job_reports(result.jobs, paths)
    return result
