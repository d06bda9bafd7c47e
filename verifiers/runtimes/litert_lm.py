"""A TFLite LLM as litert-torch's `export_hf` writes it, run the way LiteRT-LM runs it.

Such a file has no single signature the source's inputs map to: `prefill_<T>` writes T tokens
into the KV cache, `decode` one, and only decode returns logits. Each takes `tokens` (int32,
(1, T)), `input_pos` (int32, (T,): each token's position), `mask` (float, (1, 1, T, cache
length), added to the attention scores: 0 where a token may look, MASKED elsewhere) and the cache
(`kv_cache_k_<layer>`, `kv_cache_v_<layer>`), and returns the cache with those positions written.
The cache is plain input and output: the caller hands each step's back to the next.

`teacher_forced_logits` runs in the runtime's worker (verifiers.runtimes.isolation.call).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from verifiers.quiet import native_output_captured
from verifiers.runtimes import InvalidArtifact

MASKED = np.float32(-1e38)  # what litert-torch's own modules put where a position may not attend
PREFILL, DECODE, CACHE = "prefill_", "decode", "kv_cache_"


def is_litert_lm(signatures: list[str]) -> bool:
    """Whether a TFLite file's signature names are those of an export_hf LLM."""
    return DECODE in signatures and any(name.startswith(PREFILL) for name in signatures)


def teacher_forced_logits(path: str | Path, rows: list[tuple[list[int], list[int]]]) -> list[np.ndarray]:
    """For each (prompt, continuation) of `rows`: the logits, float32 (len(continuation) + 1,
    vocabulary), the LLM at `path` gives after the last token of `prompt` and after each token of
    `continuation` fed one by one, from an empty cache, as a generator runs it (`_forced`)."""
    from ai_edge_litert.interpreter import Interpreter

    with native_output_captured():
        interpreter = Interpreter(model_path=str(path))
    names = interpreter.get_signature_list()
    if not is_litert_lm(list(names)):
        raise InvalidArtifact(f"{path}: no prefill and decode signatures (it has {', '.join(names) or 'none'})")
    prefills = {int(name[len(PREFILL):]): interpreter.get_signature_runner(name)
                for name in names if name.startswith(PREFILL) and name[len(PREFILL):].isdigit()}
    return [_forced(path, prefills, interpreter.get_signature_runner(DECODE), prompt, continuation)
            for prompt, continuation in rows]


def _forced(path, prefills: dict, decode, prompt: list[int], continuation: list[int]) -> np.ndarray:
    """prompt[:-1] through the prefill signatures (the longest that is not longer than what
    is left, else the shortest, its tail padded: positions the next steps overwrite before any
    token looks at them), then every further token through decode, each step's cache the next
    step's input (XNNPACK, as the LiteRT interpreter runs by default)."""
    details = decode.get_input_details()
    cache = {name: np.zeros(d["shape"], d["dtype"]) for name, d in details.items() if name.startswith(CACHE)}
    length = int(details["mask"]["shape"][-1])
    tokens = [*prompt, *continuation]
    if len(tokens) > length:
        raise InvalidArtifact(f"{path}: its cache holds {length} positions, the check feeds {len(tokens)}")
    position = 0
    while position < len(prompt) - 1:
        left = len(prompt) - 1 - position
        size = max((t for t in prefills if t <= left), default=min(prefills))
        chunk = np.zeros((1, size), np.int32)
        real = prompt[position:position + min(size, left)]
        chunk[0, :len(real)] = real
        with native_output_captured():
            cache = _cached(prefills[size](tokens=chunk, **_at(range(position, position + size), length), **cache),
                            cache)
        position += len(real)
    logits = []
    for position in range(len(prompt) - 1, len(tokens)):
        with native_output_captured():
            result = decode(tokens=np.array([[tokens[position]]], np.int32), **_at([position], length), **cache)
        cache = _cached(result, cache)
        logits.append(np.array(result["logits"], np.float32).reshape(-1))
    return np.stack(logits)


def _at(positions, length: int) -> dict[str, np.ndarray]:
    """input_pos and the additive causal mask of tokens at `positions`."""
    input_pos = np.asarray(list(positions), np.int32)
    slots = np.arange(length, dtype=np.int32)
    mask = np.where(slots[None, :] <= input_pos[:, None], np.float32(0), MASKED).astype(np.float32)
    return {"input_pos": input_pos, "mask": mask[None, None]}


def _cached(result: dict, cache: dict) -> dict:
    return {name: np.array(result[name], copy=True) for name in cache}
