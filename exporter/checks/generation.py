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

An encoder-decoder's decoder with past is run the same way: its prompt goes to transformers'
encoder, the decoder's prefill is the decoder start token with an empty past, and every step is
fed the cross-attention keys and values transformers computed from the encoder's output (what the
encoder artifact returns), as `past_key_values.N.encoder.*`; only the decoder's own cache is carried
from step to step.

Nothing of the folder's generation_config.json applies to the reference: an end-of-sequence stop,
forced or banned tokens (BART's forced_eos_token_id) would part generate's tokens from the greedy
ones of its own logits.

The reference is taken with the source (before the export, so the source can be released); the
artifact's steps run in its runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from exporter.model_tasks import PAST, PRESENT, TASKS
from exporter.verification import Check, Verification, runs_the_artifact
from verifiers.compare import Tolerances
from verifiers.report import VALUES, Report
from verifiers.runtimes import isolation
from verifiers.runtimes.litert_lm import teacher_forced_logits
from verifiers.steps import Step

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
    (exporter.model_folders.task_module) on a seeded prompt, every forward call recorded under the
    artifact's input names. An encoder-decoder's prompt goes to its encoder (once, outside the
    recorded calls); each step's feed has the cross-attention keys and values it computed
    (`past_key_values.N.encoder.*`: the encoder artifact's outputs)."""
    import torch
    from transformers import GenerationConfig
    from transformers.generation.utils import GenerationMixin

    model = task_model.model
    prompt = PROMPTS[getattr(model, "main_input_name", "input_ids")](torch, model, np.random.default_rng([seed, 1]))
    generation = Generation()
    recorded = {name: keyword for name, keyword in task_model.keywords.items() if not name.startswith(PAST)}

    def record(module, args, kwargs):
        feed = {name: kwargs[keyword].detach().numpy().copy() for name, keyword in recorded.items()
                if isinstance(kwargs.get(keyword), torch.Tensor)}
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        past = int(cache.get_seq_length()) if cache is not None else 0
        generation.steps.append(GenerationStep(feed, np.empty(0), past))

    # the folder's generation settings are set aside while it generates (see the module docstring)
    folder_settings = model.generation_config
    greedy = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=DECODE_STEPS + 1, pad_token_id=0,
                              use_cache=True, decoder_start_token_id=folder_settings.decoder_start_token_id)
    model.generation_config = GenerationConfig()
    hook = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():  # the generic loop, not a model's own generate (Whisper's forces tokens)
            out = GenerationMixin.generate(model, **prompt, generation_config=greedy, output_logits=True,
                                           return_dict_in_generate=True)
    finally:
        hook.remove()
        model.generation_config = folder_settings
    cross = _cross_attention_feed(out.past_key_values)
    for step, logits in zip(generation.steps, out.logits):
        step.logits = logits.float().numpy()
        step.feed.update(cross)
    generation.tokens = out.sequences[:, -len(out.logits):].numpy()
    return generation


def _token_prompt(torch, model, rng) -> dict:
    """Two rows of PROMPT_LENGTH token ids, the second left-padded by PADDED."""
    prompt = torch.from_numpy(rng.integers(0, model.config.get_text_config().vocab_size, size=(2, PROMPT_LENGTH)))
    mask = torch.ones_like(prompt)
    mask[1, :PADDED] = 0
    return {"input_ids": prompt, "attention_mask": mask}


def _feature_prompt(torch, model, rng) -> dict:
    """Two rows of Whisper's log-mel features, as many frames as its encoder takes (twice its positions)."""
    config = model.config
    shape = (2, config.num_mel_bins, 2 * config.max_source_positions)
    return {"input_features": torch.from_numpy(rng.standard_normal(shape).astype(np.float32))}


PROMPTS = {"input_ids": _token_prompt, "input_features": _feature_prompt}  # by the model's main input


def _cross_attention_feed(cache) -> dict[str, np.ndarray]:
    """An encoder-decoder's cross-attention keys and values as the decoder's past inputs (none for
    a decoder-only cache)."""
    layers = getattr(getattr(cache, "cross_attention_cache", None), "layers", None) or []
    feed = {}
    for index, layer in enumerate(layers):
        feed[f"{PAST}{index}.encoder.key"] = layer.keys.numpy().copy()
        feed[f"{PAST}{index}.encoder.value"] = layer.values.numpy().copy()
    return feed


def cache_names(input_names: list[str], output_names: list[str]) -> dict[str, str]:
    """{past input: the present output that feeds it next step}, in the layout of model_tasks (an
    encoder-decoder's decoder returns no `present.N.encoder.*`: those pasts stay the encoder's)."""
    return {name: PRESENT + name[len(PAST):] for name in input_names
            if name.startswith(PAST) and PRESENT + name[len(PAST):] in output_names}


def check_generation(report: Report, runner, generation: Generation, tolerances: Tolerances) -> None:
    """Run the artifact step by step on the reference's inputs, its own presents as its past, and
    fail on logits or tokens that differ (see the module docstring); report.generation says how
    every step went."""
    inputs = {info.name: info for info in runner.inputs}
    outputs = [info.name for info in runner.outputs]
    cache = cache_names(list(inputs), outputs)
    unfed = [PRESENT + name[len(PAST):] for name in inputs
             if name.startswith(PAST) and name not in cache and name not in generation.steps[0].feed]
    if "logits" not in outputs or unfed:
        missing = unfed[0] if unfed else "logits"
        report.fail("numeric", f"generate: the artifact has no output {missing} (a past input takes it next step)")
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
        entry = {"step": index, "past_length": step.past_length, "max_abs_err": worst,
                 "tokens": tokens.tolist(), "expected_tokens": expected.tolist(), "tied_rows": []}
        steps.append(entry)
        if (error > allowed).any():
            report.fail("numeric", f"generate: {where}: output logits: max abs err {worst:.3g} (atol {tolerance.atol:g}, "
                                   f"rtol {tolerance.rtol:g}) against transformers' generate",
                        output="logits", data={"generate_step": index, "past_length": step.past_length,
                                               "cause": VALUES})
        for row in np.flatnonzero(tokens != expected):
            best = np.sort(step.logits[row])[-2:]
            if best[1] - best[0] <= worst:
                entry["tied_rows"].append(int(row))
                report.notes.append(f"generate: {where}: row {row} picks token {tokens[row]}, transformers "
                                    f"{expected[row]}: their logits tie within the artifact's error ({worst:.3g})")
            else:
                report.fail("numeric", f"generate: {where}: output logits: row {row} picks token {tokens[row]}, "
                                       f"transformers' generate {expected[row]}",
                            output="logits", data={"generate_step": index, "past_length": step.past_length,
                                                   "cause": VALUES})
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


@dataclass
class Generating:
    generation: Generation | None = None  # the source's: transformers' generate, step by step


def _reference(run: Verification) -> None:
    task = TASKS.get(run.source.facts.get("task"))
    if task is not None and task.past:
        run.of(Generating).generation = reference_generation(run.source.model, run.options["seed"])


def _generate(run: Verification) -> None:
    generation = run.of(Generating).generation
    if run.by_signatures:
        check_generation_by_rows(run.report, generation, run.tolerances, lambda rows: isolation.call(
            teacher_forced_logits, str(run.artifact.path), rows, runtime=run.runner.runtime,
            step="generating with the artifact", runner=run.runner))
        run.report.verified = True
    else:
        check_generation(run.report, run.runner, generation, run.tolerances)


CHECK = Check(
    "generation",
    on_source=(Step("reference_generation", _reference),),
    on_artifact=(Step("generate", runs_the_artifact(_generate),
                      message=lambda run: f"generating with the artifact: a prefill and {DECODE_STEPS} cached decode "
                                          "steps",
                      when=lambda run: run.active and run.of(Generating).generation is not None),),
)
