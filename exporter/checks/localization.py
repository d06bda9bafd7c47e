"""The localisation check: where a red run first departs. Which batch failed, the source traced op by op on
it (loaded again when the run had let it go), and the artifact layer's verifiers.localization run in a
runtime worker of its own (the runner's keeps its session, and a runtime that crashes on the
inspection models takes no later step with it). The report gets `divergence` and one line for
every writer; a localisation that fails is a note, never a change of verdict.

A red numeric run is localised unless --no-localize; --localize localises a green one too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from exporter.checks.data import OnData
from exporter.checks.outputs import Outputs
from exporter.checks.sizes import Sizes
from exporter.frameworks import load_source
from exporter.sources import InputSpec, Source, specs_of_tensors
from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.errors import BadInput, ExportgateError, one_line
from verifiers.localization.layouts import max_abs, scale
from verifiers.formats import Artifact
from verifiers.judging import BEFORE_REWRITE, Comparison, artifact_feed
from verifiers.quiet import quiet_exporter
from verifiers.report import Finding, Report
from verifiers.runtimes import isolation, runtime_for
from verifiers.steps import Progress, Step

# An artifact's precision (verifiers.precision's mode) -> the epsilon its ops round to; integer
# artifacts are diagnosed layer by layer against a float twin instead (exporter.checks.quantization).
EPSILONS = {"float": float(np.finfo(np.float32).eps), "fp16": float(np.finfo(np.float16).eps)}
SAME_OUTPUTS_RTOL = 1e-6  # a source loaded again must give the outputs it gave (relative to their scale)


def numeric_failures(report: Report) -> list[Finding]:
    """The outputs found to differ, in the artifact as it is (not as it was before a --gelu
    rewrite); an artifact that fails to run at some size has nothing there to localise."""
    return [f for f in report.failures if f.kind == "numeric" and f.data.get("compared") != BEFORE_REWRITE
            and "max_abs_err" in f.data]


def wanted(localize: bool | None, report: Report) -> bool:
    """--localize, or by default a run whose outputs differ."""
    return localize if localize is not None else bool(numeric_failures(report))


def failing_batch(report: Report, feeds: list[dict], reference: list, sized: dict,
                  on_data: tuple | None = None) -> tuple[dict, list, str]:
    """The batch to localise on, the source's outputs there, and how the report names it: the
    first failure's worst batch, its size of a dynamic axis, or the --data batch holding its worst
    sample (`on_data`: exporter.checks.data.OnData.worst); the first batch on a green run."""
    failures = numeric_failures(report)
    first = failures[0] if failures else None
    if first is not None and first.data.get("data") and on_data is not None:
        feed, outputs, sample, numbers = on_data
        return feed, outputs, f"the --data batch of samples {', '.join(map(str, numbers))} (worst: sample {sample})"
    if first is not None and "dynamic" in first.data:
        symbol, size = first.data["dynamic"]["symbol"], first.data["dynamic"]["size"]
        if (symbol, size) in sized:
            feed, outputs = sized[(symbol, size)]
            return feed, outputs, f"the batch at {symbol} = {size}"
    batch = first.data.get("batch", 0) if first is not None else 0
    return feeds[batch], reference[batch][2], f"batch {batch}"


def localize(report: Report, source: Source, feeds: list[dict], reference: list, sized: dict, artifact: Artifact,
             comparison: Comparison, progress: Progress, reload: Callable[[], Source],
             on_data: tuple | None = None) -> None:
    """Fill report.divergence: where the artifact (run by `comparison.runner`, closed by now) first
    departs from the source on the failing batch of `feeds` (or of `sized`, the other sizes), whose
    outputs are in `reference`; `reload()` is the source loaded again, for a run that released it."""
    mode = report.quantization.get("mode") or "float"
    if mode not in EPSILONS:
        report.notes.append(f"localisation: not for {mode} artifacts (their layers are compared with a float twin)")
        return
    feed, outputs, which = failing_batch(report, feeds, reference, sized, on_data)
    loaded, source_feed = source, feed
    if source.model is None:
        progress("loading the source model again to trace it op by op")
        source = reload()
        source_feed = as_reloaded(feed, loaded, source)
        differs = _reload_differs(source, source_feed, outputs)
        if differs:
            report.notes.append(f"localisation: {differs}, so it cannot be traced as it ran: pass --localize to "
                                "trace it once")
            return
    progress(f"tracing the source model op by op on {which}")
    try:
        with quiet_exporter():
            trace = source.framework.trace(source, source_feed)
    except ExportgateError:
        raise
    except Exception as exc:  # noqa: BLE001 - a model the tracer cannot follow: the run's verdict stands
        report.notes.append(f"localisation: the source could not be traced op by op: {one_line(exc)}")
        return
    if trace is None:
        report.notes.append(f"localisation: {source.framework.name} models cannot be traced op by op yet")
        return
    report.notes.extend(f"localisation: {note}" for note in trace.notes)
    from verifiers.localization.divergence import localize as localize_artifact

    runner = comparison.runner  # closed: its inputs, outputs and runtime are what is asked of it
    runner_class = runtime_for(artifact.format.name, runner.runtime)
    progress("running the artifact with every tensor kept, then with the source's values fed in")
    output_keys = {comparison.artifact_names[art]: trace.outputs[ref] for ref, art in comparison.pairs
                   if ref < len(trace.outputs)}
    try:
        found = isolation.call(localize_artifact, artifact.format, artifact.path, trace,
                               artifact_feed(runner, feed), runner_class, EPSILONS[mode], output_keys,
                               _arithmetic_variant(report), runtime=runner.runtime, step="localising the divergence")
    except Exception as exc:  # noqa: BLE001 - a diagnosis never changes the run's verdict
        report.notes.append(f"localisation: the artifact could not be run with its tensors kept: {one_line(exc)}")
        return
    found = module_by_weights(found, source, trace)
    report.divergence = {**found.to_dict(), "batch": which, "message": found.message(bool(numeric_failures(report)))}


def _arithmetic_variant(report: Report) -> str | None:
    """The variant to look inside: the first failure's where it is the run in float16 arithmetic
    (emulated, or XNNPACK forced to FP16), else None (the runtime's own run)."""
    failures = numeric_failures(report)
    variant = failures[0].data.get("variant") if failures else None
    return variant if variant == "float16" and variant in report.arithmetic else None


def module_by_weights(divergence, source: Source, trace):
    """The first divergence's module from its weights, where nothing surer said it
    (verifiers.localization.weights): its line becomes that module's first op's."""
    from dataclasses import replace

    from verifiers.localization.weights import owner

    first = divergence.first
    if first is None or not first.weights:
        return divergence
    module = owner(first.weights, source.framework.parameters(source))
    if module is None or module == first.module:
        return divergence
    location = next((t.location for t in trace.coarse() if t.module == module), first.source)
    return replace(divergence, first=replace(first, module=module, source=location, evidence="weights"))


def reload_source(spec: str, input_specs, default_inputs, trust_source: bool, task: str | None = None) -> Source:
    return load_source(spec, input_specs, default_inputs=default_inputs, trust_source=trust_source, task=task)


def as_reloaded(feed: dict, loaded: Source, reloaded: Source) -> dict:
    """`feed` (by the first load's input names) under the names the source has when loaded again:
    a framework may number its own names per process (Keras: keras_tensor, then keras_tensor_156),
    so inputs of the same count, shapes and types are matched by position."""
    if loaded.input_names == reloaded.input_names or [(s.shape, s.dtype) for s in loaded.inputs] != [
            (s.shape, s.dtype) for s in reloaded.inputs]:
        return feed
    return {new: feed[old] for old, new in zip(loaded.input_names, reloaded.input_names)}


def _reload_differs(source: Source, feed: dict, outputs: list[np.ndarray]) -> str | None:
    """Why the source loaded again is not the source that ran (None: it gives the same outputs)."""
    try:
        again = source.run(feed)[2]
    except BadInput as exc:
        return f"the source model loaded again fails on the batch ({exc})"
    if len(again) != len(outputs) or not all(
            a.shape == b.shape and max_abs(a, b) <= SAME_OUTPUTS_RTOL * scale(b) for a, b in zip(again, outputs)):
        return "the source model gives other outputs when loaded again (random weights without a seed?)"
    return None


def _localize(run: Verification) -> None:
    runner = run.runner
    runner.close()  # its memory goes first; its inputs, outputs and runtime are what is asked of it

    def default_inputs() -> list[InputSpec]:  # for a source without input specs (verify)
        return specs_of_tensors(runner.inputs)

    localize(run.report, run.source, run.feeds, run.reference, run.of(Sizes).sized, run.artifact,
             run.of(Outputs).comparison, run.progress, reload=lambda: reload_source(
                 run.source.spec, run.input_specs, default_inputs, run.options["trust_source"], run.report.task),
             on_data=run.of(OnData).worst)


CHECK = Check(
    "localization",
    # Last of the checks: the artifact's runner goes first, its memory with it.
    on_artifact=(Step("localize", runs_the_artifact(_localize), message=lambda run: "localising the divergence",
                      when=lambda run: run.active and not run.by_signatures
                      and wanted(run.options["localize"], run.report)),),
    keeps_source=lambda run: bool(run.options["localize"]),  # its trace: a red run traces a source loaded again
)
