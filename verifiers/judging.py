"""Judging an artifact against its source, the artifact layer's part: run the artifact beside the
source's outputs, compare them (at every size of its dynamic axes), and judge every GELU. What
differs by format is asked of the artifact (verifiers.formats), what differs by runtime of its
runner (verifiers.runtimes); exporter.verification puts these in the order a command runs them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from verifiers.compare import Tolerances, compare_outputs, match_outputs
from verifiers.errors import BadInput, ExportgateError, one_line
from verifiers.formats import Artifact, detect_format, measured_sites, opened
from verifiers.gelu.configured import Declared
from verifiers.quantization.metrics import dequantize, quantize
from verifiers.report import VALUES, Report
from verifiers.steps import Progress, count, silent
from verifiers.runtimes import InvalidArtifact, Runner, open_runner, run_model, runtime_for
from verifiers.runtimes import isolation
from verifiers.sizes import is_dynamic, symbol_of


# In a finding's data: it is about the export as it was before a declared GELU rewrite.
BEFORE_REWRITE = "before_gelu_rewrite"


def load_runner(artifact: Artifact, runtime: str | None = None, wait: bool = True) -> Runner:
    """The artifact loaded in its runtime (the format's default when None), in a worker; with
    `wait` False, loading there while the caller goes on (see open_runner)."""
    return open_runner(artifact.format.name, artifact.path, runtime, wait=wait)


def describe_artifact(path: str | Path, runtime: str | None = None) -> dict[str, Any]:
    """Format, opsets or runtime version, op counts, inputs and outputs, and the GELU sites with
    their claimed and measured flavours, without importing torch or TensorFlow. The file is read
    here, without a runtime session; only the GELU probes cut out of it run, in a runtime worker
    (one started ahead imports the runtime while the file is read; none starts for an artifact
    without GELU sites)."""
    from verifiers.gelu.inventory import describe_sites

    fmt = detect_format(path)
    with isolation.ProbesInWorker(runtime_for(fmt.name, runtime)) as probes:
        artifact = fmt.open(path)
        info = artifact.describe()
        info["gelu"] = describe_sites(artifact.activation_sites(probes))
    for tensor in info["inputs"]:
        tensor["dynamic_axes"] = [{"axis": k, "symbol": symbol_of(dim, k)} for k, dim in enumerate(tensor["shape"])
                                  if is_dynamic(dim)]
    return info


def artifact_inventory(artifact: Artifact, runner: Runner, progress: Progress = silent) -> list:
    """The artifact's GELU and ReLU sites, measured on the probes in the runner's runtime and worker."""
    runner_class = runtime_for(artifact.format.name, runner.runtime)
    return isolation.call(measured_sites, artifact.format.name, artifact.path, runner_class, runtime=runner.runtime,
                          step="measuring the artifact's GELU sites", runner=runner,
                          on_progress=lambda done, total: count(progress, "GELU probes", done, total))


def compare(report: Report, runner: Runner, feeds, reference, tolerances: Tolerances, progress) -> Comparison:
    ref_names, names_are_real = reference[0][0], reference[0][1]
    art_names = [o.name for o in runner.outputs]
    pairs = match_outputs(ref_names, names_are_real, art_names)
    unknown = tolerances.unknown_outputs(ref_names)
    if unknown:
        raise BadInput(f"tolerance given for unknown output(s) {', '.join(unknown)} "
                       f"(outputs: {', '.join(ref_names)})")
    artifact_feeds = [artifact_feed(runner, feed) for feed in feeds]
    with report.timed("run_artifact"):
        progress(f"running the artifact on {len(feeds)} batch(es)")
        runs: dict[str, list[list[np.ndarray]]] = {variant: [] for variant in runner.variants}
        for done, feed in enumerate(artifact_feeds):
            count(progress, "batches", done, len(artifact_feeds))
            try:
                outputs = _real_runs(runner, runner.infer(feed))
            except ExportgateError:
                raise
            except Exception as exc:
                raise InvalidArtifact(f"the artifact failed to run: {one_line(exc)}") from exc
            for variant in runner.variants:
                runs[variant].append(outputs[variant])
        count(progress, "batches", len(artifact_feeds), len(artifact_feeds))
    comparison = Comparison(ref_names, art_names, pairs, [r[2] for r in reference], artifact_feeds, runner)
    with report.timed("compare"):
        for k, variant in enumerate(runner.variants):
            results, findings = comparison.against(runs[variant], tolerances)
            if k == 0:
                report.outputs.extend(results)
            else:
                report.variant_outputs[variant] = results
                for finding in findings:
                    finding.message = f"({variant}) {finding.message}"
                    finding.data["variant"] = variant
            report.failures.extend(findings)
    if len(runner.variants) > 1:
        report.notes.append(f"{runner.runtime} ran the artifact {len(runner.variants)} ways: "
                            f"{', '.join(runner.variants)} (outputs: {runner.variants[0]})")
    return comparison


@dataclass
class Comparison:
    """Source outputs and how they pair with the artifact's, to judge any run of the artifact."""

    reference_names: list[str]
    artifact_names: list[str]
    pairs: list[tuple[int, int]]
    reference_outputs: list[list[np.ndarray]]
    artifact_feeds: list[dict[str, np.ndarray]]
    runner: Runner | None = None  # what ran the artifact: its worker also runs the GELU probes

    def against(self, artifact_outputs, tolerances: Tolerances):
        return compare_outputs(self.reference_names, self.artifact_names, self.pairs,
                               self.reference_outputs, artifact_outputs, tolerances)

    def against_at(self, reference: list[np.ndarray], artifact: list[np.ndarray], tolerances: Tolerances):
        """One batch of the source's outputs against the artifact's (a batch at another size)."""
        return compare_outputs(self.reference_names, self.artifact_names, self.pairs, [reference], [artifact],
                               tolerances)


def judge_gelu(report: Report, artifact: Artifact, captured: list | str | None, runner: Runner,
               declared: dict[str, str] | None = None, progress: Progress = silent,
               configured: Declared | None = None) -> list | None:
    """Find every GELU on both sides, measure the artifact's, and fail on any silent change;
    returns the artifact's measured sites (None when they were not measured).

    `captured` is the source's activation sites as its framework ran it, or why they could not be
    read (a source graph that cannot be read fails the run: the guard cannot vouch for the
    artifact), or None when the user turned the guard off, which the report records. `configured`
    is what the source's config declares its activations to be (a transformers model folder): a
    site computing another GELU flavour is reported (verifiers.gelu.configured)."""
    from verifiers.gelu.site_flavour import SiteFlavour
    from verifiers.gelu.verdict import DECLARED, INDISTINGUISHABLE, describe, judge

    if captured is None:
        report.gelu_guard = "off (--no-gelu-guard)"
        report.notes.append("GELU guard off (--no-gelu-guard): no GELU site was checked")
        return None
    if isinstance(captured, str):
        report.gelu_guard = "failed: the source graph could not be read"
        report.fail("gelu_guard", f"the GELU guard could not read the source graph ({captured}); "
                                  "pass --no-gelu-guard to ship without the guard")
        return None
    source_sites = [SiteFlavour(s, s.claimed, scale=s.scale) for s in captured]
    artifact_sites = artifact_inventory(artifact, runner, progress)
    verdicts = judge(source_sites, artifact_sites, declared)
    report.gelu_guard = "checked"
    report.gelu = [v.to_dict() for v in verdicts]
    off_config = set()
    if configured is not None and configured.flavours:
        off = {"source": configured.off(source_sites), "artifact": configured.off(artifact_sites)}
        off_config = {id(s) for s in off["artifact"]}
        report.gelu_configured = {"declared": configured.to_dict(), "off": [
            {"side": side, "site": s.site.site_id, "op": s.site.op, "flavour": s.flavour}
            for side, sites in off.items() for s in sites]}
        report.notes.extend(f"GELU off its config: source site {describe(s)} computes {s.flavour}, while the config "
                            f"declares {configured.says()}; the artifact is judged against what the source computes"
                            for s in off["source"])
    for verdict in verdicts:
        if verdict.failed:
            side = verdict.artifact or verdict.source
            said = (f"; the config declares {configured.says()}" if id(verdict.artifact) in off_config else "")
            report.fail("gelu", verdict.message() + said, site=side.site.site_id)
        elif verdict.status in (DECLARED, INDISTINGUISHABLE):
            report.notes.append(verdict.message())
    if any(v.status == DECLARED for v in verdicts) and not any(v.failed for v in verdicts):
        _accept_declared_differences(report)
    return artifact_sites


def _accept_declared_differences(report: Report) -> None:
    """Outputs differ from the source's when a GELU's flavour changed as the user asked: with every
    other GELU kept, such differences are reported, not failed (those of the export before the
    rewrite still fail: the declared change cannot explain them)."""
    numeric = [f for f in report.failures if f.kind == "numeric" and f.data.get("cause") == VALUES
               and f.data.get("compared") != BEFORE_REWRITE]
    for finding in numeric:
        report.failures.remove(finding)
        report.notes.append(f"{finding.message} -- expected from the declared GELU change, not a failure")


def gelu_sensitivity(report: Report, artifact: Artifact, artifact_sites: list, comparison: Comparison,
                     tolerances: Tolerances) -> None:
    """Say when the output tolerance alone could not have told exact GELU from tanh: swap exact
    and tanh at every site of the artifact, run the variant on one batch (the last, a seeded
    random one unless --batches 0), and see whether it would still pass. The variant is built and
    run in the runner's worker, beside the artifact, reading the artifact's weights where they lie."""
    one_batch = dataclasses.replace(comparison, reference_outputs=comparison.reference_outputs[-1:],
                                    artifact_feeds=comparison.artifact_feeds[-1:])
    runner_class = runtime_for(artifact.format.name, comparison.runner.runtime)
    try:
        runs = isolation.call(swapped_outputs, artifact.format.name, artifact.path, artifact_sites,
                              one_batch.artifact_feeds, runner_class, runtime=runner_class.runtime,
                              step="running the GELU-swapped variant", runner=comparison.runner)
    except ValueError as exc:  # a site the rewrite cannot isolate
        report.notes.append(f"GELU tolerance check skipped: {exc}")
        return
    if runs is None:
        return
    results, _ = one_batch.against(runs, tolerances)
    for result in results:
        report.gelu_swap_effect[result.name] = result.max_abs_err
        if result.passed:
            report.notes.append(
                f"output {result.name}: atol {result.atol:g} / rtol {result.rtol:g} cannot tell exact GELU "
                f"from tanh here (swapping every GELU's flavour moves it by at most {result.max_abs_err:.2g} "
                f"and would still pass); only the GELU guard sees such a change")


def swapped_outputs(fmt: str, path: Path, sites: list, feeds: list[dict[str, np.ndarray]],
                    runner_class: type[Runner]) -> list[list[np.ndarray]] | None:
    """The outputs on `feeds` of the artifact at `path` with every exact GELU written as tanh and
    every tanh as exact, run by `runner_class` (a module-level function, for a runtime worker);
    None when it has no such site."""
    variant = opened(fmt, path).gelu_swapped(sites)
    return None if variant is None else run_model(runner_class, variant, feeds, data_folder=Path(path).parent)


def artifact_feed(runner: Runner, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Source inputs under the artifact's input names, as a caller hands them to it: quantized where
    it takes quantized values, cast where it takes another float type (float16)."""
    named = named_feed(runner, feed)
    return {info.name: _as_taken(info, named[info.name]) for info in runner.inputs}


def named_feed(runner: Runner, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Source inputs under the artifact's input names: by name when they match, else by order."""
    names = [i.name for i in runner.inputs]
    if set(names) <= set(feed):
        chosen = {name: feed[name] for name in names}
    elif len(names) == len(feed):
        chosen = dict(zip(names, feed.values()))
    else:
        raise BadInput(f"the artifact takes inputs {', '.join(names)} and the source "
                       f"{', '.join(feed)}; they cannot be matched by name or by order")
    return chosen


FLOAT_TYPES = ("float16", "float32", "float64")  # the float types a feed is cast between


def _as_taken(info, value: np.ndarray) -> np.ndarray:
    """A float source input for an artifact input holding quantized values: quantized with the
    artifact's own scale and zero point; for one of another float type: cast to it (as a caller of
    the artifact would)."""
    if value.dtype.kind != "f":
        return value
    if info.quantization is not None:
        scale, zero_point = info.quantization
        return quantize(value, scale, zero_point, np.dtype(info.dtype))
    if info.dtype in FLOAT_TYPES and info.dtype != value.dtype.name:
        return value.astype(info.dtype)
    return value


HALF_TYPES = ("float16", "bfloat16")


def half_type_changes(runner: Runner, feed: dict[str, np.ndarray], outputs: list[np.ndarray],
                      pairs: list[tuple[int, int]]) -> list[tuple[str, str, str, str]]:
    """The artifact's inputs and outputs in a 16-bit float type where the source's are wider: (input
    or output, name, the artifact's type, the source's). (A float64 source's float32 artifact is
    what every exporter to a float32-only format writes.)"""
    changes = []
    named = named_feed(runner, feed)
    for info in runner.inputs:
        value = named[info.name]
        if value.dtype.kind == "f" and info.dtype in HALF_TYPES and value.dtype.name not in HALF_TYPES:
            changes.append(("input", info.name, info.dtype, value.dtype.name))
    for ref_index, art_index in pairs:
        info, source = runner.outputs[art_index], np.asarray(outputs[ref_index]).dtype
        if source.kind == "f" and info.dtype in HALF_TYPES and source.name not in HALF_TYPES:
            changes.append(("output", info.name, info.dtype, source.name))
    return changes


def real_values(infos: list, outputs: list[np.ndarray]) -> list[np.ndarray]:
    """An artifact's outputs as the real values they hold: quantized outputs dequantized with their
    own scale and zero point, the others as they are."""
    return [value if info.quantization is None else dequantize(value, *info.quantization)
            for info, value in zip(infos, outputs)]


def _real_runs(runner: Runner, runs: dict[str, list[np.ndarray]]) -> dict[str, list[np.ndarray]]:
    return {variant: real_values(runner.outputs, outputs) for variant, outputs in runs.items()}


def run_artifact(runner: Runner, feed: dict[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    """The artifact's real output values on a source feed, by way of running it (runner.variants);
    an artifact that fails to run is InvalidArtifact."""
    try:
        return _real_runs(runner, runner.infer(artifact_feed(runner, feed)))
    except ExportgateError:
        raise
    except Exception as exc:
        raise InvalidArtifact(f"the artifact failed to run: {one_line(exc)}") from exc


def fixed_in_artifact(report: Report, plans: list, inputs: list, exporter: str | None = None) -> None:
    """Fail (exit 4) every axis an export declared dynamic that came out static in the artifact,
    naming input and axis; such a symbol is not run at other sizes (the artifact refuses them)."""
    shapes = {info.name: info.shape for info in inputs}
    for plan in plans:
        fixed = [(a, shapes[a.input][a.axis]) for a in plan.axes
                 if a.input in shapes and a.axis < len(shapes[a.input]) and not is_dynamic(shapes[a.input][a.axis])]
        if not fixed:
            continue
        axis, size = fixed[0]
        why = "; torch.export specialised it" if exporter and "dynamo" in exporter else ""
        plan.static = f"declared dynamic, static in the artifact (size {size}){why}"
        report.fail("target", f"input {axis.input} axis {axis.axis} is dynamic in the source and static in the "
                              f"artifact (size {size}){why}", data={"dynamic": {"input": axis.input, "axis": axis.axis}})


def compare_at_sizes(report: Report, comparison: Comparison, plans: list, sized: dict, tolerances: Tolerances,
                     progress: Progress = silent) -> None:
    """Run the artifact on the feeds at every other planned size (`sized`: (symbol, size) -> (feed,
    the source's outputs there)) and compare; a difference or a runtime error there fails (exit 1)
    naming input, axis and size. Fills report.dynamic."""
    runner = comparison.runner
    export_err = max((o.max_abs_err or 0.0 for o in report.outputs), default=0.0)
    todo = [(plan, size) for plan in plans if plan.static is None for size in plan.extra_sizes
            if (plan.symbol, size) in sized]
    with report.timed("sizes"):
        if todo:
            progress(f"running the artifact at {len(todo)} other size(s) of {len(plans)} dynamic symbol(s)")
        for done, (plan, size) in enumerate(todo):
            count(progress, "sizes", done, len(todo))
            feed, reference = sized[(plan.symbol, size)]
            where = plan.where(size)
            try:
                outputs = _real_runs(runner, runner.infer(artifact_feed(runner, feed)))
            except ExportgateError as exc:
                if exc.kind not in ("input", "numeric"):
                    raise  # a crashed or hung runtime stays a runtime failure
                outputs, error = None, str(exc)
            except Exception as exc:  # noqa: BLE001 - the runtime's own error at this size
                outputs, error = None, one_line(exc)
            if outputs is None:
                plan.failed[size] = f"the artifact fails to run: {error}"
                report.fail("numeric", f"the artifact fails to run at {where}: {error}",
                            data={"dynamic": {"symbol": plan.symbol, "size": size}, "cause": "run"})
                continue
            worst = 0.0
            for variant in runner.variants:
                results, findings = comparison.against_at(reference, outputs[variant], tolerances)
                if variant == runner.variants[0]:
                    worst = max((r.max_abs_err or 0.0 for r in results), default=0.0)
                other = variant != runner.variants[0]
                for finding in findings:
                    message = _at_size(finding, where)
                    finding.message = f"({variant}) {message}" if other else message
                    if other:
                        finding.data["variant"] = variant
                    finding.data["dynamic"] = {"symbol": plan.symbol, "size": size}
                    report.failures.append(finding)
                    plan.failed.setdefault(size, message)
            plan.max_abs_err[size] = worst
        count(progress, "sizes", len(todo), len(todo))
    for plan in plans:
        if plan.static is None:
            plan.max_abs_err[plan.export_size] = export_err
        report.dynamic.extend(plan.entries())


def _at_size(finding, where: str) -> str:
    """`output y: max abs err 1.23 at x axis 1 = 11 (export size 6)`, or the finding's message
    with the place added."""
    if ("max_abs_err" in finding.data and "sqnr_db" not in finding.data and finding.output
            and finding.data.get("cause") != "nonfinite"):  # its error over the finite values says nothing
        return f"output {finding.output}: max abs err {finding.data['max_abs_err']:.3g} at {where}"
    return f"{finding.message} at {where}"


def baked_size_hints(report: Report, artifact: Artifact, plans: list) -> None:
    """Hint at constant shapes that hold a dynamic symbol's export size (a Reshape to [2, -1]
    when the batch was exported at 2): the artifact may hold that size whatever it is given."""
    sizes = {}
    for plan in plans:
        if plan.export_size > 1:
            sizes.setdefault(plan.export_size, plan)
    if not sizes:
        return
    for node, op, values in artifact.shape_constants():
        held = [size for size in dict.fromkeys(values) if size in sizes]
        if held:
            plan = sizes[held[0]]
            report.dynamic_hints.append({"kind": "constant_shape", "location": node, "message": (
                f"{op} node {node!r} reads the constant {values}, which holds {held[0]}, the export size of "
                f"{', '.join(a.describe() for a in plan.axes)}")})
