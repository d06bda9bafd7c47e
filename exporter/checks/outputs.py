"""The outputs check: the source's outputs on every seeded batch, and the artifact's compared with
them output by output (verifiers.judging.compare)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.judging import Comparison, compare
from verifiers.steps import Step


@dataclass
class Outputs:
    comparison: Comparison | None = None  # the artifact's outputs against the source's, on every feed


def reference(run: Verification) -> None:
    run.reference = [run.source.run(feed) for feed in run.feeds]


def compare_outputs(run: Verification) -> None:
    before = len(run.report.failures)
    run.of(Outputs).comparison = compare(run.report, run.runner, run.feeds, run.reference, run.tolerances,
                                         run.progress)
    run.report.verified = True
    if run.options["data"] and run.tolerances.integer is not None:
        # An int8 artifact is judged on the data (exporter.checks.data): its calibration chose the
        # ranges the data has, which example or random inputs need not keep to.
        set_aside = run.report.failures[before:]
        del run.report.failures[before:]
        run.report.notes.extend(f"int8 artifact judged on --data alone; on the batches besides it: {f.message}"
                                for f in set_aside)


CHECK = Check(
    "outputs",
    on_source=(Step("reference", reference,
                    message=lambda run: f"running the source model on {len(run.feeds)} batch(es)"),),
    on_artifact=(Step("compare", runs_the_artifact(compare_outputs),
                      when=lambda run: run.active and not run.by_signatures, timed=False),),
)
