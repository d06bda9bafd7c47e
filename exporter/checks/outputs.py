"""The outputs check: the source's outputs on every seeded batch, and the artifact's compared with
them output by output (verifiers.judging.compare)."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.judging import Comparison, compare, half_type_changes
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
    _judge_float_types(run)
    if run.options["data"] and run.tolerances.integer is not None:
        # An int8 artifact is judged on the data (exporter.checks.data): its calibration chose the
        # ranges the data has, which example or random inputs need not keep to.
        set_aside = run.report.failures[before:]
        del run.report.failures[before:]
        run.report.notes.extend(f"int8 artifact judged on --data alone; on the batches besides it: {f.message}"
                                for f in set_aside)


def _judge_float_types(run: Verification) -> None:
    """An input or output in float16 where the source's is float32 changes the interface every
    caller codes against: a failure, or a note where the export was asked for it (--io float16)."""
    asked = run.options.get("io") == "float16"
    for side, name, found, expected in half_type_changes(run.runner, run.feeds[0], run.reference[0][2],
                                                         run.of(Outputs).comparison.pairs):
        message = f"{side} {name}: the artifact's is {found}, the source's {expected}"
        if asked:
            run.report.notes.append(f"{message} (--io {run.options['io']})")
        else:
            run.report.fail("numeric", f"{message}, a type every caller of the artifact sees: keep the source's "
                                       "types at its inputs and outputs (export --io float, or keep_io_types=True)",
                            output=name if side == "output" else None, data={"cause": "dtype", side: name})


CHECK = Check(
    "outputs",
    on_source=(Step("reference", reference,
                    message=lambda run: f"running the source model on {len(run.feeds)} batch(es)"),),
    on_artifact=(Step("compare", runs_the_artifact(compare_outputs),
                      when=lambda run: run.active and not run.by_signatures, timed=False),),
)
