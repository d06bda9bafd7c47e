"""--measure: what the artifact costs in its runtime (verifiers.measurement), measured once it is
judged, on the first verification batch, in a fresh runtime worker (its memory is the artifact's
runtime alone). `exportgate measure` measures an artifact with no source (exporter.measuring)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.errors import BadInput, one_line
from verifiers.formats import open_artifact
from verifiers.judging import artifact_feed
from verifiers.report import Report
from verifiers.runtimes import Runner, runtime_for
from verifiers.runtimes import isolation
from verifiers.steps import Progress, Step

if TYPE_CHECKING:
    from exporter.gelu_forms import GeluForm
    from verifiers.measurement import Measurement


BUDGETS = ("max_latency", "max_memory", "baseline", "baseline_artifact")
# Against --baseline-artifact, or with GELU forms: each file measured this many times, in turn, each
# time in a fresh worker; the range of 6 rounds' medians is their interval (verifiers.measurement.pooled).
ROUNDS = 6


def wants_measurement(options: dict[str, Any]) -> bool:
    """--measure, or a budget or baseline to hold the measurement to."""
    return bool(options["measure"] or any(options[name] is not None for name in BUDGETS))


@dataclass
class Measured:
    baseline: dict | None = None  # --baseline's measurement, read before anything runs


def measure(report: Report, runner_class: type[Runner], path: Path, feed: dict[str, np.ndarray],
            options: dict[str, Any], baseline: dict | None, progress: Progress,
            forms: Sequence[GeluForm] = ()) -> None:
    """report.measurement of the artifact at `path` run by `runner_class` on `feed` (by its input
    names), at most --measure-seconds of timed runs per way of running and batch size, held to the
    budgets the options give and to `baseline` (read_baseline's; exit 5 over them). With
    --baseline-artifact, or GELU `forms` to compare (exporter.gelu_forms), every file is measured
    in turn with the artifact (measure_in_turn)."""
    from verifiers.measurement import measure_artifact, overruns

    seconds = options["measure_seconds"]
    entries = [("the artifact", runner_class, path)]
    if options["baseline_artifact"] is not None:
        against = Path(options["baseline_artifact"])
        entries.append(("the baseline artifact", runtime_for(open_artifact(against).format.name, options["runtime"]),
                        against))
    entries += [(f"GELU form {form.name}", runner_class, form.path) for form in forms]
    if len(entries) == 1:
        progress(f"measuring the artifact in {runner_class.runtime} (up to {seconds:g} s per way of running and "
                 "batch)")
        measurements = [isolation.call(measure_artifact, runner_class, path, feed, seconds, node_scopes(path),
                                       runtime=runner_class.runtime, step="measuring the artifact")]
    else:
        measurements = measure_in_turn(entries, feed, seconds, progress)
    report.measurement = measurements.pop(0).to_dict()
    if options["baseline_artifact"] is not None:
        baseline = report.measurement["baseline_artifact"] = {"path": options["baseline_artifact"],
                                                              **measurements.pop(0).to_dict()}
    if forms:
        report.measurement["gelu_forms"] = [{"form": form.name, "keeps_flavour": form.keeps_flavour,
                                             **each.to_dict()} for form, each in zip(forms, measurements)]
    report.measurement["budgets"] = {name: value for name, value in options.items()
                                     if name in (*BUDGETS, "max_regression") and value is not None}
    found, notes = overruns(report.measurement, options["max_latency"], options["max_memory"], baseline,
                            options["max_regression"] / 100)
    report.notes.extend(notes)
    for overrun in found:
        report.fail("budget", overrun.message, data={"metric": overrun.metric, "measured": overrun.measured,
                                                     "limit": overrun.limit, "baseline": overrun.baseline,
                                                     "grew": dict(overrun.grew), "grew_in": dict(overrun.grew_in)})


def measure_in_turn(entries: Sequence[tuple[str, type[Runner], Path]], feed: dict[str, np.ndarray], seconds: float,
                    progress: Progress) -> list[Measurement]:
    """Each (what it is, runner class, path) measured in turn, ROUNDS times over, each time in a
    fresh worker with a ROUNDS-th of the time given, so that all see the same machine; each one's
    rounds pooled (verifiers.measurement.pooled), in the order given."""
    from verifiers.measurement import measure_artifact, pooled

    share = seconds / ROUNDS
    scopes = [node_scopes(path) for _, _, path in entries]
    rounds: list[list[Measurement]] = [[] for _ in entries]
    for round_ in range(1, ROUNDS + 1):
        for (what, runner_class, path), each_scopes, taken in zip(entries, scopes, rounds):
            progress(f"measuring {what} in {runner_class.runtime}, round {round_} of {ROUNDS} (up to {share:.2g} s "
                     "per way of running and batch)")
            taken.append(isolation.call(measure_artifact, runner_class, path, feed, share, each_scopes,
                                        runtime=runner_class.runtime, step=f"measuring {what}"))
    return [pooled(taken) for taken in rounds]


def node_scopes(path: Path) -> dict[str, str]:
    """Each node of the artifact at `path` by name, with the module or name scope its exporter
    recorded (verifiers.localization.graph.Scope.path; ROOT for none): the profile's modules."""
    from verifiers.measurement import ROOT

    graph = open_artifact(path).format.localization_graph(path)
    return {op.name: op.scope.path if op.scope is not None and op.scope.parts else ROOT for op in graph.ops}


def read_baseline(options: dict[str, Any]) -> dict | None:
    """--baseline's measurement, read before anything runs (bad input when it holds none); with
    --baseline-artifact instead, that file checked to be an artifact (it is measured later)."""
    path, artifact = options["baseline"], options["baseline_artifact"]
    if path is not None and artifact is not None:
        raise BadInput("--baseline and --baseline-artifact: give one, the previous release's report or its artifact")
    if artifact is not None:
        try:
            open_artifact(Path(artifact))
        except BadInput as exc:
            raise BadInput(f"--baseline-artifact: {exc}") from exc
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
    run.of(Measured).baseline = read_baseline(run.options)


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
    on_source=(Step("baseline", _read_baseline, when=lambda run: run.options["baseline"] is not None
                    or run.options["baseline_artifact"] is not None),),
    on_artifact=(Step("measure", runs_the_artifact(_measure),
                      when=lambda run: run.active and wants_measurement(run.options) and not run.by_signatures),
                 Step("not_measured", _not_measured,
                      when=lambda run: wants_measurement(run.options) and (not run.active or run.by_signatures))),
)
