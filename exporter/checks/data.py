"""The data check (--data): the artifact against its source on the user's own samples. The data is
read and checked against the source's inputs as the source loads (before anything runs:
exporter.verification.make_feeds), then streamed batch by batch (exporter.feed_files.DataSet):
each batch runs in the source and in the artifact, every output's statistics are counted per
sample (verifiers.sample_statistics), and the batch is let go. Only the batch holding the worst
sample so far is kept, for the localisation of a red run (exporter.checks.localization).

A decoder exported with past takes no samples of its own inputs (its cache is the previous step's
output): its data are prompts (token ids and their mask, what generate takes), padded on the left
as batched generation pads them, and the generation check (exporter.checks.generation) generates
on them, batch by batch, in place of this check's run.

The report's `data` says what was fed (the files and their SHA-256, samples, batches, samples
repeated to fill the last batch, each input's range, how text was padded) and each output's
statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from exporter.checks.outputs import Outputs
from exporter.digests import sha256
from exporter.feed_files import DataSet
from exporter.model_tasks import TASKS
from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.errors import BadInput
from verifiers.judging import named_feed, run_artifact
from verifiers.sample_statistics import Floors, OutputStatistics
from verifiers.steps import Step, count


@dataclass
class OnData:
    data: DataSet | None = None
    # The batch that holds the worst sample so far: (feed, the source's outputs on it, that
    # sample's number, the numbers of the batch's samples).
    worst: tuple[dict, list, int, list[int]] | None = None
    prompts: bool = False  # the data are a decoder's prompts: the generation check runs them


# What a prompt gives generate (a decoder with past): the rest of its inputs generate makes.
PROMPT_INPUTS = ("input_ids", "attention_mask")


# An int8 export given --data and no --calibration: (n, k) parts of the samples, by number modulo n.
CALIBRATION_PART, VERIFICATION_PART = (2, 0), (2, 1)
PART_NAMES = {CALIBRATION_PART: "even-numbered", VERIFICATION_PART: "odd-numbered"}


def data_set(run: Verification, dynamic: set[tuple[str, int]], part: tuple[int, int] | None = None) -> DataSet:
    """The --data samples (or `part` of them), every one read and checked against the source's
    inputs (BadInput naming the file, the input and what is wrong)."""
    from exporter.model_folders import is_model_folder

    folder = Path(run.source.spec) if is_model_folder(Path(run.source.spec)) else None
    specs, padding_side = run.source.inputs, None
    if _prompts(run):
        specs = [spec for spec in run.source.inputs if spec.name in PROMPT_INPUTS]
        padding_side = "left"
    data = DataSet(run.options["data"], specs, dynamic, cast=run.options["data_cast"], folder=folder, part=part,
                   padding_side=padding_side)
    data.scan()
    return data


def _prompts(run: Verification) -> bool:
    """Whether the data are a decoder's prompts (see the module's docstring)."""
    task = TASKS.get(run.source.facts.get("task"))
    if task is None or not task.past:
        return False
    if task.call != "cached":
        raise BadInput(f"--data on {task.name}: an encoder-decoder's decoder takes its prompts through the "
                       "encoder, which this export is not, and generates on seeded prompts: give --data to the "
                       f"encoder's export ({task.name.replace('-with-past', '-encoder')})", option="data")
    return True


def read_data(run: Verification, dynamic: set[tuple[str, int]], part: tuple[int, int] | None = None) -> DataSet:
    """The samples the artifact is verified on (`part` of --data: the rest calibrated an int8
    export), recorded in the report."""
    data = data_set(run, dynamic, part)
    run.of(OnData).data = data
    run.of(OnData).prompts = _prompts(run)
    run.report.data = {
        "spec": data.spec,
        "files": [{"path": str(path), "sha256": sha256(path)} for path in data.files()],
        "samples": data.samples, "batches": data.batches, "batch_size": data.batch_size,
        "filled": data.filled, "shapes": data.shapes,
        "inputs": {name: {"min": low, "max": high} for name, (low, high) in data.ranges.items()},
        **({"verified_on": f"the {PART_NAMES[part]} samples"} if part else {}),
    }
    padding = data.text_padding()
    if padding is not None:
        run.report.data["padding"] = padding
    if not run.verifying:
        run.report.notes.append(f"--data: its {data.samples} sample(s) were read and checked, not run: --no-verify "
                                "skips the verification they are for")
    if data.truncated:
        run.report.data["truncated"] = data.truncated
        run.report.notes.append(f"--data: {len(data.truncated)} text sample(s) longer than the export's "
                                f"{data.specs[0].shape[1]} tokens, cut there (first: sample {data.truncated[0]})")
    if data.filled:
        run.report.notes.append(f"--data: {data.samples} sample(s) are not a multiple of the batch size "
                                f"{data.batch_size}: {data.filled} repeated to fill the last batch(es), not counted")
    return data


def _outside_calibration(run: Verification, ranges: dict, batch, found: dict) -> None:
    """Count the samples of `batch` whose inputs reach beyond the range the artifact's calibration
    chose for them, by more than one quantization step (values beyond are clamped: within a step,
    no worse than rounding)."""
    feed = named_feed(run.runner, batch.feed)
    for name, (low, high) in ranges.items():
        if name not in feed:
            continue
        margin = (high - low) / 255
        values = np.asarray(feed[name], np.float64)
        for row, number in enumerate(batch.numbers):
            sample = values[row] if values.ndim else values
            lo, hi = float(sample.min()), float(sample.max())
            if lo >= low - margin and hi <= high + margin:
                continue
            entry = found.setdefault(name, {"input": name, "range": [low, high], "samples": 0, "first_sample": number,
                                            "reach": [lo, hi]})
            entry["samples"] += 1
            entry["reach"] = [min(entry["reach"][0], lo), max(entry["reach"][1], hi)]


def _outside_message(entry: dict) -> str:
    low, high = entry["range"]
    return (f"input {entry['input']}: {entry['samples']} sample(s) lie outside the calibration range [{low:.4g}, "
            f"{high:.4g}] (first: sample {entry['first_sample']}; values from {entry['reach'][0]:.4g} to "
            f"{entry['reach'][1]:.4g})")


# The floors of the statistics over samples: each Floors field's flag.
FLOOR_FLAGS = {"min_sqnr_db": "--min-sqnr", "min_cosine": "--min-cosine", "min_top1": "--min-top1"}


def floors(run: Verification) -> Floors:
    """The floors given for the statistics on --data: all three for a float artifact; an int8
    one's SQNR and top-1 are judged by its thresholds already (exporter.checks.quantization)."""
    options = run.options
    if run.tolerances.integer is not None:
        return Floors(min_cosine=options["min_cosine"])
    return Floors(options["min_sqnr"], options["min_cosine"], options["min_top1"])


def _note_unused_floors(run: Verification) -> None:
    """A floor given where nothing it gates is measured: said, not silently dropped."""
    given = floors(run)
    unused = [flag for field, flag in FLOOR_FLAGS.items() if getattr(given, field) is not None]
    if unused:
        run.report.notes.append(f"{', '.join(unused)}: not applied: {'they gate' if len(unused) > 1 else 'it gates'} "
                                "the statistics over --data's samples (and an int8 artifact's SQNR and top-1); give "
                                "--data to apply them")


def _judge_on_data(run: Verification) -> None:
    state = run.of(OnData)
    comparison = run.of(Outputs).comparison
    variants = run.runner.variants
    statistics: dict[tuple[int, str], OutputStatistics] = {}
    ranges = run.artifact.input_ranges() if run.tolerances.integer is not None else {}  # an integer artifact's
    outside: dict[str, dict] = {}
    worst_seen = -1.0
    done = 0
    for batch in state.data.batches_of():
        count(run.progress, "batches", done, state.data.batches)
        _outside_calibration(run, ranges, batch, outside)
        names, _, reference = run.source.run(batch.feed)
        outputs = run_artifact(run.runner, batch.feed)
        for variant in variants:
            for ref_index, art_index in comparison.pairs:
                ref, art = reference[ref_index], outputs[variant][art_index]
                key = (ref_index, variant)
                if key not in statistics:
                    statistics[key] = OutputStatistics(
                        names[ref_index], variant if len(variants) > 1 else None,
                        run.tolerances.for_output(names[ref_index], ref.dtype))
                statistics[key].add(np.asarray(ref), np.asarray(art), batch.numbers)
        primary = [s for (_, variant), s in statistics.items() if variant == variants[0]]
        worst = max((s.max_abs.worst for s in primary if s.max_abs.worst is not None), default=-1.0)
        if worst > worst_seen:  # the batch holding the worst sample so far: kept for the localisation
            worst_seen = worst
            sample = max(primary, key=lambda s: s.max_abs.worst or 0.0).max_abs.worst_sample
            state.worst = ({k: v.copy() for k, v in batch.feed.items()}, reference, sample, batch.numbers)
        done += 1
    count(run.progress, "batches", done, state.data.batches)
    run.report.data["outputs"] = [s.record() for s in statistics.values()]
    where = run.options["data"]
    if outside:
        run.report.data["outside_calibration"] = list(outside.values())
        run.report.notes.extend(f"--data: {_outside_message(entry)}" for entry in outside.values())
    for stats in statistics.values():
        for finding in stats.findings(where, run.tolerances.integer, floors(run)):
            if outside and run.tolerances.integer is not None:
                finding.message += "; " + "; ".join(_outside_message(entry) for entry in outside.values())
                finding.data["outside_calibration"] = list(outside)
            run.report.failures.append(finding)
    run.report.verified = True


CHECK = Check(
    "data",
    on_artifact=(Step("unused_floors", _note_unused_floors, when=lambda run: run.active and not run.options["data"]),
                 Step("data", runs_the_artifact(_judge_on_data),
                      message=lambda run: f"running the source and the artifact on {run.of(OnData).data.samples} "
                                          f"sample(s) of {run.options['data']}",
                      when=lambda run: run.active and run.of(OnData).data is not None and not run.of(OnData).prompts
                      and not run.by_signatures),),
    keeps_source=lambda run: bool(run.options["data"]),  # the source runs beside the artifact, batch by batch
)
