"""A decoder exported with past, run the way generation runs it, against transformers' own `generate`.

Comparing one call at random past values (what every export gets) does not show a cache that is
wrong only across steps: a layer's present handed back as another's, positions that restart, a
mask that forgets the past. So a model folder exported for a task with past is also run as a
generator: a prompt of two rows (the second left-padded) is prefilled with an empty cache, then
DECODE_STEPS tokens are decoded one at a time, each step feeding the artifact the present outputs
of the step before as its past.

The reference is transformers' `generate` on the same prompt, greedy (a plain GenerationConfig:
no sampling, no end-of-sequence stop, no processors, whatever the folder's generation_config.json
says), recording for every forward call what the model was fed (input ids, attention mask,
position ids: exactly as generate makes them) and the logits it returned. The artifact gets those
inputs step by step; its own presents are its past. At every step its last-position logits are
compared with transformers' (the output's tolerances), and its greedy token with generate's: a
token that differs is a failure unless transformers' two best logits there are closer than the
artifact's error (a tie the runtimes may break either way), which is a note.

The reference is taken with the source (before the export, so the source can be released); the
artifact's steps run in its runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exporter.model_tasks import PAST, PRESENT
from verifiers.compare import Tolerances
from verifiers.report import Report

DECODE_STEPS = 4  # decode steps after the prefill, each with a longer past
PROMPT_LENGTH = 6
PADDED = 2  # positions of left padding in the prompt's second row


@dataclass
class GenerationStep:
    feed: dict[str, np.ndarray]  # what the model got besides the cache: input_ids, attention_mask, position_ids
    logits: np.ndarray  # transformers' logits at the last position (batch, vocabulary)
    past_length: int


@dataclass
class Generation:
    steps: list[GenerationStep] = field(default_factory=list)
    tokens: np.ndarray | None = None  # generate's new tokens (batch, steps)


def reference_generation(task_model, seed: int) -> Generation:
    """transformers' greedy `generate` of the model inside a model folder's task module
    (exporter.model_folders.task_module) on a seeded prompt, every forward call recorded."""
    import torch
    from transformers import GenerationConfig

    model = task_model.model
    vocabulary = model.config.get_text_config().vocab_size
    rng = np.random.default_rng([seed, 1])
    prompt = torch.from_numpy(rng.integers(0, vocabulary, size=(2, PROMPT_LENGTH)))
    mask = torch.ones_like(prompt)
    mask[1, :PADDED] = 0
    generation = Generation()
    wanted = ("input_ids", "attention_mask", "position_ids")

    def record(module, args, kwargs):
        feed = {name: kwargs[name].detach().numpy().copy() for name in wanted
                if isinstance(kwargs.get(name), torch.Tensor)}
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None else 0
        generation.steps.append(GenerationStep(feed, np.empty(0), past))

    greedy = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=DECODE_STEPS + 1, eos_token_id=None,
                              pad_token_id=0, use_cache=True)
    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            out = model.generate(input_ids=prompt, attention_mask=mask, generation_config=greedy,
                                 output_logits=True, return_dict_in_generate=True)
    finally:
        hook.remove()
    for step, logits in zip(generation.steps, out.logits):
        step.logits = logits.float().numpy()
    generation.tokens = out.sequences[:, PROMPT_LENGTH:].numpy()
    return generation


def cache_names(input_names: list[str]) -> dict[str, str]:
    """{past input: the present output that feeds it next step}, in the layout of model_tasks."""
    return {name: PRESENT + name[len(PAST):] for name in input_names if name.startswith(PAST)}


def check_generation(report: Report, runner, generation: Generation, tolerances: Tolerances) -> None:
    """Run the artifact step by step on the reference's inputs, its own presents as its past, and
    fail on logits or tokens that differ (see the module docstring); report.generation says how
    every step went."""
    inputs = {info.name: info for info in runner.inputs}
    outputs = [info.name for info in runner.outputs]
    cache = cache_names(list(inputs))
    missing = [name for name in ("logits", *cache.values()) if name not in outputs]
    if missing:
        report.fail("numeric", f"generate: the artifact has no output {missing[0]} (a past input takes it next step)")
        return
    batch = generation.tokens.shape[0]
    past = {name: np.zeros((batch, inputs[name].shape[1], 0, inputs[name].shape[3]), np.dtype(inputs[name].dtype))
            for name in cache}
    logits = []
    for step in generation.steps:
        feed = {name: value for name, value in step.feed.items() if name in inputs}
        result = dict(zip(outputs, runner.run({**feed, **past})))
        logits.append(result["logits"][:, -1, :].astype(np.float32))
        past = {name: result[present] for name, present in cache.items()}
    judge_generation(report, generation, logits, tolerances)


def forced_tokens(generation: Generation) -> list[tuple[list[int], list[int]]]:
    """Per prompt row: its tokens without padding, and the tokens generate fed after it (for an
    artifact that runs one row at a time from position 0: transformers' left-padded row has its
    positions counted from its first real token, so the two compute the same)."""
    first = generation.steps[0].feed
    rows = []
    for row, ids in enumerate(first["input_ids"]):
        mask = first.get("attention_mask", np.ones_like(first["input_ids"]))[row]
        rows.append((ids[mask.astype(bool)].tolist(), generation.tokens[row, :len(generation.steps) - 1].tolist()))
    return rows


def judge_generation(report: Report, generation: Generation, logits: list[np.ndarray], tolerances: Tolerances) -> None:
    """Hold the artifact's last-position logits at every step, (batch, vocabulary) each, against
    transformers' and its greedy tokens against generate's; report.generation says how every
    step went."""
    tolerance = tolerances.for_output("logits", np.float32)
    steps = []
    for index, (step, found) in enumerate(zip(generation.steps, logits)):
        error = np.abs(found - step.logits)
        worst = float(error.max())
        allowed = tolerance.atol + tolerance.rtol * np.abs(step.logits)
        tokens, expected = found.argmax(-1), generation.tokens[:, index]
        where = "prefill" if index == 0 else f"decode step {index}"
        where += f" (past length {step.past_length})"
        steps.append({"step": index, "past_length": step.past_length, "max_abs_err": worst,
                      "tokens": tokens.tolist(), "expected_tokens": expected.tolist()})
        if (error > allowed).any():
            report.fail("numeric", f"generate: {where}: output logits: max abs err {worst:.3g} (atol {tolerance.atol:g}, "
                                   f"rtol {tolerance.rtol:g}) against transformers' generate",
                        output="logits", data={"generate_step": index, "past_length": step.past_length})
        for row in np.flatnonzero(tokens != expected):
            best = np.sort(step.logits[row])[-2:]
            if best[1] - best[0] <= worst:
                report.notes.append(f"generate: {where}: row {row} picks token {tokens[row]}, transformers "
                                    f"{expected[row]}: their logits tie within the artifact's error ({worst:.3g})")
            else:
                report.fail("numeric", f"generate: {where}: output logits: row {row} picks token {tokens[row]}, "
                                       f"transformers' generate {expected[row]}",
                            output="logits", data={"generate_step": index, "past_length": step.past_length})
    report.generation = {"prompt_length": PROMPT_LENGTH, "decode_steps": len(steps) - 1,
                         "tokens": generation.tokens.tolist(), "steps": steps}


def check_generation_by_rows(report: Report, generation: Generation, tolerances: Tolerances, logits_of) -> None:
    """check_generation for an artifact that generates one row at a time from position 0 (an LLM of
    prefill and decode signatures): `logits_of(rows)` returns, for each (prompt, forced tokens) of
    `forced_tokens`, its logits after the prompt and after each forced token, (steps, vocabulary);
    the rows are judged together, as check_generation judges them."""
    rows = logits_of(forced_tokens(generation))
    judge_generation(report, generation, [np.stack([row[step] for row in rows]) for step in range(len(generation.steps))],
                     tolerances)
