"""--measure: what the artifact costs in its runtime (verifiers.measurement), measured once it is
judged, on the first verification batch, in a fresh runtime worker (its memory is the artifact's
runtime alone). `exportgate measure` measures an artifact with no source (exporter.measuring)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.judging import artifact_feed
from verifiers.report import Report
from verifiers.runtimes import Runner, runtime_for
from verifiers.runtimes import isolation
from verifiers.steps import Progress, Step


def measure(report: Report, runner_class: type[Runner], path: Path, feed: dict[str, np.ndarray], seconds: float,
            progress: Progress) -> None:
    """report.measurement of the artifact at `path` run by `runner_class` on `feed` (by its input
    names), at most `seconds` of timed runs per way of running and batch size."""
    from verifiers.measurement import measure_artifact

    progress(f"measuring the artifact in {runner_class.runtime} (up to {seconds:g} s per way of running and batch)")
    measured = isolation.call(measure_artifact, runner_class, path, feed, seconds, runtime=runner_class.runtime,
                              step="measuring the artifact")
    report.measurement = measured.to_dict()


def _measure(run: Verification) -> None:
    runner_class = runtime_for(run.artifact.format.name, run.options.get("runtime"))
    measure(run.report, runner_class, run.artifact.path, artifact_feed(run.runner, run.feeds[0]),
            run.options["measure_seconds"], run.progress)


CHECK = Check(
    "measurement",
    on_artifact=(Step("measure", runs_the_artifact(_measure),
                      when=lambda run: run.active and run.options["measure"] and not run.by_signatures),),
)
