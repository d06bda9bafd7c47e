"""--measure: what the artifact costs in its runtime (verifiers.measurement), measured once it is
judged, on the first verification batch, in a fresh runtime worker (its memory is the artifact's
runtime alone). `exportgate measure` measures an artifact with no source (exporter.measuring)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.errors import BadInput, one_line
from verifiers.judging import artifact_feed
from verifiers.report import Report
from verifiers.runtimes import Runner, runtime_for
from verifiers.runtimes import isolation
from verifiers.steps import Progress, Step


def wants_measurement(options: dict[str, Any]) -> bool:
    """--measure, or a budget or baseline to hold the measurement to."""
    return bool(options["measure"] or any(options[name] is not None for name in BUDGETS))


BUDGETS = ("max_latency", "max_memory", "baseline")


@dataclass
class Measured:
    baseline: dict | None = None  # --baseline's measurement, read before anything runs


def measure(report: Report, runner_class: type[Runner], path: Path, feed: dict[str, np.ndarray],
            options: dict[str, Any], baseline: dict | None, progress: Progress) -> None:
    """report.measurement of the artifact at `path` run by `runner_class` on `feed` (by its input
    names), at most --measure-seconds of timed runs per way of running and batch size, held to the
    budgets the options give and to `baseline` (read_baseline's; exit 5 over them)."""
    from verifiers.measurement import measure_artifact, overruns

    seconds = options["measure_seconds"]
    progress(f"measuring the artifact in {runner_class.runtime} (up to {seconds:g} s per way of running and batch)")
    measured = isolation.call(measure_artifact, runner_class, path, feed, seconds, runtime=runner_class.runtime,
                              step="measuring the artifact")
    report.measurement = measured.to_dict()
    report.measurement["budgets"] = {name: value for name, value in options.items()
                                     if name in (*BUDGETS, "max_regression") and value is not None}
    found, notes = overruns(report.measurement, options["max_latency"], options["max_memory"], baseline,
                            options["max_regression"] / 100)
    report.notes.extend(notes)
    for overrun in found:
        report.fail("budget", overrun.message, data={"metric": overrun.metric, "measured": overrun.measured,
                                                     "limit": overrun.limit, "baseline": overrun.baseline,
                                                     "grew": dict(overrun.grew)})


def read_baseline(path: str | None) -> dict | None:
    """The measurement of the report at `path` (--baseline); bad input when it holds none."""
    if path is None:
        return None
    try:
        measured = json.loads(Path(path).read_text()).get("measurement")
    except (OSError, ValueError, AttributeError) as exc:
        raise BadInput(f"--baseline {path}: not a readable JSON report ({one_line(exc)}); give the --report of a "
                       "run with --measure") from exc
    if not measured:
        raise BadInput(f"--baseline {path}: the report holds no measurement (write it with --measure and --report, "
                       "or with `exportgate measure --report`)")
    return measured


def _read_baseline(run: Verification) -> None:
    run.of(Measured).baseline = read_baseline(run.options["baseline"])


def _not_measured(run: Verification) -> None:
    if run.active:  # by signatures
        why = "an LLM of prefill and decode signatures is verified by generating, and not measured yet"
    else:
        why = ("an artifact is measured once verified, and " + ("--no-verify skips it" if not run.verifying
                                                                else "this one did not load"))
    run.report.notes.append(f"not measured: {why}")


def _measure(run: Verification) -> None:
    runner_class = runtime_for(run.artifact.format.name, run.options.get("runtime"))
    measure(run.report, runner_class, run.artifact.path, artifact_feed(run.runner, run.feeds[0]), run.options,
            run.of(Measured).baseline, run.progress)


CHECK = Check(
    "measurement",
    on_source=(Step("baseline", _read_baseline, when=lambda run: run.options["baseline"] is not None),),
    on_artifact=(Step("measure", runs_the_artifact(_measure),
                      when=lambda run: run.active and wants_measurement(run.options) and not run.by_signatures),
                 Step("not_measured", _not_measured,
                      when=lambda run: wants_measurement(run.options) and (not run.active or run.by_signatures))),
)
