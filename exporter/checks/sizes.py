"""The sizes check: each dynamic axis at its other sizes. The source runs on one seeded batch at
each size planned for each symbol (verifiers.sizes.plan_sizes); an axis the source declared that
came out static fails (exit 4 naming it), the others run there; an axis the artifact made dynamic
unasked is listed, not run (the source's outputs there were not computed)."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.checks.outputs import Outputs
from exporter.sources import stated_length_limit
from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.errors import BadInput
from verifiers.judging import baked_size_hints, compare_at_sizes, fixed_in_artifact
from verifiers.sizes import DynamicAxis, SymbolSizes, artifact_axes, plan_sizes, sized_feed, undeclared_entry
from verifiers.steps import Step


@dataclass
class Sizes:
    axes: list[DynamicAxis] = field(default_factory=list)  # the dynamic axes verified at several sizes
    plans: list[SymbolSizes] = field(default_factory=list)  # the sizes each symbol of `axes` is tried at
    sized: dict = field(default_factory=dict)  # (symbol, size) -> (feed, the source's outputs there)


def _reference_at_sizes(run: Verification) -> None:
    """The source's outputs at each other size; a size the source itself cannot run at is skipped
    (the artifact is not to blame)."""
    sizes = run.of(Sizes)
    sizes.plans = plan_sizes(sizes.axes, run.feeds[0], stated_length_limit(run.source.model))
    for plan in sizes.plans:
        for size in plan.extra_sizes:
            feed = sized_feed(run.feeds[0], plan, size, run.options["seed"])
            try:
                sizes.sized[(plan.symbol, size)] = (feed, run.source.run(feed)[2])
            except BadInput as exc:
                plan.skipped[size] = str(exc).replace("the source model failed on its inputs", "the source model fails")


def _judge_sizes(run: Verification) -> None:
    sizes = run.of(Sizes)
    fixed_in_artifact(run.report, sizes.plans, run.runner.inputs, run.report.exporter)
    baked_size_hints(run.report, run.artifact, sizes.plans)
    compare_at_sizes(run.report, run.of(Outputs).comparison, sizes.plans, sizes.sized, run.tolerances, run.progress)
    declared = {(a.input, a.axis) for a in sizes.axes}
    run.report.dynamic.extend(undeclared_entry(axis) for axis in artifact_axes(run.runner.inputs)
                              if (axis.input, axis.axis) not in declared)


CHECK = Check(
    "sizes",
    on_source=(Step("reference_sizes", _reference_at_sizes, when=lambda run: bool(run.of(Sizes).axes)),),
    on_artifact=(Step("sizes", runs_the_artifact(_judge_sizes), when=lambda run: run.active and not run.by_signatures,
                      timed=False),),
)
