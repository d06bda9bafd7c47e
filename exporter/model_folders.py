"""A transformers `save_pretrained` folder as a source model: MODEL is a directory holding
config.json, exported for a task (exporter.model_tasks).

What the folder may do is checked before transformers reads it:
- config.json must load as JSON and name a model_type; a config that brings its own code
  (`auto_map`) loads only with --trust-source (transformers' trust_remote_code);
- weights load from safetensors (model.safetensors, or the shards model.safetensors.index.json
  lists, each a file inside the folder); pickled weights (pytorch_model.bin) only with
  --trust-source, as unpickling runs code;
- the task is --task, else the one whose head class is config.architectures[0] (through
  transformers' auto mappings; a causal LM's is text-generation-with-past, as runtimes run it);
  when that names none or several, exit 2 lists the tasks the model type has (an encoder-decoder's
  two parts with past are never inferred). A model type that has no head for the task is exit 4,
  naming both.

The model is the task's head class loaded from the folder (no download: local files only), called
with the task's inputs by keyword and returning the task's outputs by name; its example inputs are
drawn from the config (vocabulary, image size, channels), and the task's symbolic axes are the
source's dynamic axes. How the model is called is the task's (CALLS): its head on the inputs; a
decoder with its cache; an encoder-decoder's encoder with the cross-attention cache it hands the
decoder, or its decoder with both caches. A task with past takes its inputs positionally
(`past_key_values.0.key` is no Python name): one past key and value per layer of the cache
transformers builds for the model, in the shapes it builds them (heads, head size); the cache it
returns is the present outputs. A model whose cache holds no keys and values per layer (a state
space model) has no such task: exit 4.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from exporter.model_tasks import ENCODERS, PAST, PAST_MASK, PRESENT, TASKS, Task, TaskInput
from exporter.sources import stated_length_limit
from verifiers.errors import BadInput, Incompatible, one_line
from verifiers.sizes import PADDING_SIDES, DynamicAxis

CONFIG = "config.json"
SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLED, PICKLED_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
EXAMPLE_SIZES = {"batch_size": 2, "sequence_length": 8, "decoder_sequence_length": 4, "num_choices": 2}
# With past: a step of three new tokens after five cached ones (distinct sizes: one baked into the
# artifact cannot pass for another).
PAST_SIZES = {"sequence_length": 3, "past_sequence_length": 5, PAST_MASK: 8, "decoder_sequence_length": 3,
              "past_decoder_sequence_length": 5}
# What an application needs beside the artifact to feed it and read it: tokenizer, preprocessor and
# generation settings, published next to the artifact when the folder has them.
PROCESSING_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.txt",
    "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "tokenizer.model", "chat_template.jinja",
    "chat_template.json", "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
    "generation_config.json",
)


def is_model_folder(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file()


@dataclass(frozen=True)
class Folder:
    path: Path
    config: dict
    model_type: str
    task: Task
    weights: tuple[Path, ...]  # every weight file the model loads
    pickled: bool  # weights in pickles (only with --trust-source)

    @property
    def processing(self) -> list[Path]:
        """Its tokenizer and preprocessor files (PROCESSING_FILES), regular files only: a link
        could name any file on the machine, and what is published beside the artifact is the folder's."""
        return [self.path / name for name in PROCESSING_FILES
                if (self.path / name).is_file() and not (self.path / name).is_symlink()]

    @property
    def files(self) -> list[Path]:
        """What the model is built from: its config and its weights (safetensors are memory-mapped,
        so the audit hook that sees other reads does not see them)."""
        return [self.path / CONFIG, *self.weights]


def read_folder(path: Path, task: str | None, trust: bool) -> Folder:
    """The folder's config, task and weight files, checked (see the module docstring)."""
    label = str(path)
    try:
        config = json.loads((path / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise BadInput(f"{label}/{CONFIG} does not load: {one_line(exc)}") from exc
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise BadInput(f"{label}/{CONFIG} names no model_type: not a transformers model folder")
    if config.get("auto_map") and not trust:
        raise BadInput(f"{label}: its config brings its own code (auto_map); pass --trust-source to run it")
    weights, pickled = _weights(path, label, trust)
    model_type = config["model_type"]
    return Folder(path, config, model_type, _task(config, model_type, task, label), weights, pickled)


def _weights(path: Path, label: str, trust: bool) -> tuple[tuple[Path, ...], bool]:
    for single, index, pickled in ((SAFETENSORS, SAFETENSORS_INDEX, False), (PICKLED, PICKLED_INDEX, True)):
        if not (path / single).is_file() and not (path / index).is_file():
            continue
        if pickled and not trust:
            raise BadInput(f"{label}: its weights are pickles ({single}), which run code as they load; pass "
                           "--trust-source to load a folder you trust, or save it with safetensors")
        if (path / single).is_file():
            return (path / single,), pickled
        return _shards(path, index, label), pickled
    raise BadInput(f"{label}: no weights ({SAFETENSORS} or {SAFETENSORS_INDEX})")


def _shards(path: Path, index: str, label: str) -> tuple[Path, ...]:
    """The shard files an index names, each a regular file inside the folder."""
    try:
        weight_map = json.loads((path / index).read_text(encoding="utf-8"))["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadInput(f"{label}/{index} does not load: {one_line(exc)}") from exc
    folder = path.resolve()
    shards = []
    for name in names:
        shard = (path / str(name)).resolve()
        if not isinstance(name, str) or Path(name).is_absolute() or folder not in shard.parents:
            raise BadInput(f"{label}/{index} names a shard outside the folder: {name!r}")
        if not shard.is_file():
            raise BadInput(f"{label}/{index} names a shard that is missing: {name}")
        shards.append(path / name)
    return tuple(shards)


def _mapping(task: Task) -> dict[str, str]:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, task.mapping)


def _task(config: dict, model_type: str, name: str | None, label: str) -> Task:
    if name is not None:
        if name not in TASKS:
            raise BadInput(f"--task {name}: unknown task (known: {', '.join(TASKS)})")
        task = TASKS[name]
        if model_type not in _mapping(task):
            raise Incompatible(f"model type {model_type} has no {name} head in transformers: cannot export "
                               f"{label} for {name}", kind="target")
        return task
    architectures = config.get("architectures") or []
    found = [t for t in TASKS.values() if not t.part and architectures and architectures[0] in _mapping(t).values()]
    if len(found) > 1 and len({t.mapping for t in found}) == 1:  # one head, with and without past:
        found = [t for t in found if t.past]  # a decoder ships with its cache, as runtimes run it
    if len(found) == 1:
        return found[0]
    candidates = [t.name for t in TASKS.values() if model_type in _mapping(t)]
    said = f"its architecture {architectures[0]} does" if architectures else "its config names no architecture, which"
    raise BadInput(f"{label}: {said} not tell one task; give --task, one of: {', '.join(candidates) or 'none known'}")


def tasks_with_cache(model_type: str, past: bool, head_of: Task) -> list[str]:
    """The tasks a model type has a head for whose artifact takes a KV cache (`past`) or not: the
    one of `head_of`'s head when there is one, else every such task."""
    fitting = [t for t in TASKS.values() if not t.part and t.past == past and model_type in _mapping(t)]
    return [t.name for t in [t for t in fitting if t.mapping == head_of.mapping] or fitting]


def load_folder(folder: Folder, trust: bool) -> tuple[Any, dict[str, np.ndarray], list[DynamicAxis]]:
    """The task's model loaded from the folder, its example inputs (in the order the model takes
    them) and its dynamic axes."""
    import torch
    import transformers
    from transformers.utils import logging as transformers_logging

    head = getattr(transformers, _mapping(folder.task)[folder.model_type])
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # exportgate's progress says what is loading
    try:
        model = head.from_pretrained(str(folder.path), trust_remote_code=trust, local_files_only=True,
                                     use_safetensors=not folder.pickled)
    except Exception as exc:
        raise BadInput(f"{folder.path}: transformers cannot load it as {head.__name__}: {one_line(exc)}") from exc
    finally:
        if bars:
            transformers_logging.enable_progress_bar()
    model.eval()
    call = CALLS[folder.task.call](torch, model, folder.task, folder.model_type)
    inputs = [*_inputs(model, folder.task), *call.past_inputs]
    sizes = _sizes(model, folder.task)
    sides = padding_sides_of(folder.path)
    example = {spec.name: _example(spec, model.config, sizes, sides) for spec in inputs}
    dynamic = [DynamicAxis(spec.name, k, symbol, low=0 if symbol.startswith("past_") else 1)
               for spec in inputs for k, symbol in enumerate(spec.axes) if symbol in folder.task.dynamic]
    return task_module(torch, model, inputs, folder.task, call), example, dynamic


def _inputs(model, task: Task) -> list[TaskInput]:
    main = getattr(model, "main_input_name", "input_ids")
    if main not in task.inputs:
        raise Incompatible(f"{task.name} takes {' or '.join(task.inputs)}, and {type(model).__name__} takes {main}",
                           kind="target")
    taken = set(inspect.signature(model.forward).parameters)
    return [spec for spec in task.inputs[main] if spec.keyword in taken]


def cache_argument(model) -> str:
    """The keyword a model's forward takes its cache by: `cache` (transformers 5), formerly `past_key_values`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def returned_cache(result):
    """The cache a forward returned (`cache`, formerly `past_key_values`)."""
    cache = result.get("cache")
    return cache if cache is not None else result.get("past_key_values")


class HeadCall:
    """The head called on the task's inputs by keyword, returning the task's outputs by name."""

    def __init__(self, torch, model, task: Task, model_type: str):
        self.model, self.task = model, task
        self.past_inputs: list[TaskInput] = []  # the cache's inputs, after the task's

    def __call__(self, arguments: dict) -> dict:
        extra = {"use_cache": False} if self.task.causal else {}
        result = self.model(**arguments, **extra, return_dict=True)
        return {name: result[name] for name in self.task.outputs}

    def _pop_pasts(self, arguments: dict) -> list:
        return [arguments.pop(spec.name) for spec in self.past_inputs]


class CachedCall(HeadCall):
    """A decoder with its cache: one past key and value per layer of the cache transformers builds
    for the model (one token in), in the heads and head size of that layer, handed to the model as a
    DynamicCache; the cache it returns is the present outputs."""

    def __init__(self, torch, model, task: Task, model_type: str):
        super().__init__(torch, model, task, model_type)
        with torch.no_grad():
            cache = returned_cache(model(input_ids=torch.zeros((1, 1), dtype=torch.long), use_cache=True))
        self.past_inputs = _past_inputs(_key_value_layers(torch, cache, model_type, task), "", "past_sequence_length")

    def __call__(self, arguments: dict) -> dict:
        from transformers import DynamicCache

        tensors = self._pop_pasts(arguments)
        cache = DynamicCache(ddp_cache_data=list(zip(tensors[0::2], tensors[1::2])), config=self.model.config)
        result = self.model(**arguments, **{cache_argument(self.model): cache}, use_cache=True, return_dict=True)
        return {**{name: result[name] for name in self.task.outputs}, **_presents(returned_cache(result), "")}


class EncoderCall(HeadCall):
    """An encoder-decoder's encoder, returning beside its hidden states every decoder layer's
    cross-attention key and value, computed by the decoder's own cross-attention modules (the ones
    transformers calls with `key_value_states`) into an EncoderDecoderCache, as the decoder's first
    step fills it. Found on a short example at load, and held to the cross-attention cache transformers
    itself returns there: a model whose modules compute it otherwise is exit 4."""

    def __init__(self, torch, model, task: Task, model_type: str):
        super().__init__(torch, model, task, model_type)
        self.attentions, probe, result = _cross_attentions(torch, model, task)
        expected = _presents(getattr(returned_cache(result), "cross_attention_cache", None), "encoder.")
        with torch.no_grad():
            found = self(dict(probe))  # a copy: the call takes its arguments
        if not expected or any(found.get(name) is None or not torch.allclose(found[name], value)
                               for name, value in expected.items()):
            raise Incompatible(f"model type {model_type}: its decoder's cross-attention keys and values cannot be "
                               f"computed from its encoder's output alone, so it has no {task.name} export",
                               kind="target")

    def __call__(self, arguments: dict) -> dict:
        from transformers import DynamicCache, EncoderDecoderCache

        hidden = self.model.get_encoder()(**arguments)[0]
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for attention in self.attentions:  # the query is not used: only the cache's keys and values are
            attention(hidden_states=hidden[:, :1], key_value_states=hidden, cache=cache)
        return {"last_hidden_state": hidden, **_presents(cache.cross_attention_cache, "encoder.")}


class CachedDecoderCall(HeadCall):
    """An encoder-decoder's decoder with its cache: per layer its own past key and value
    (`decoder.`) and the encoder's cross-attention ones (`encoder.`, EncoderCall's outputs), handed
    to the model as an EncoderDecoderCache whose cross-attention part is read, never computed: the
    encoder's hidden states the model is given are zeros of their shape. It returns the logits and
    its own presents."""

    def __init__(self, torch, model, task: Task, model_type: str):
        super().__init__(torch, model, task, model_type)
        _, result = _first_step(torch, model, task)
        cache = returned_cache(result)
        self.hidden_size = result["encoder_last_hidden_state"].shape[-1]
        own = _key_value_layers(torch, getattr(cache, "self_attention_cache", None), model_type, task)
        cross = _key_value_layers(torch, getattr(cache, "cross_attention_cache", None), model_type, task)
        self.layers = len(own)
        mine = _past_inputs(own, "decoder.", "past_decoder_sequence_length")
        theirs = _past_inputs(cross, "encoder.", "encoder_sequence_length")
        # optimum's order: per layer its own key and value, then the encoder's
        self.past_inputs = [spec for layer in range(self.layers) for spec in (*mine[2 * layer:2 * layer + 2],
                                                                                *theirs[2 * layer:2 * layer + 2])]

    def __call__(self, arguments: dict) -> dict:
        from transformers import DynamicCache, EncoderDecoderCache

        tensors = self._pop_pasts(arguments)  # per layer: own key, own value, cross key, cross value
        cache = EncoderDecoderCache(DynamicCache(ddp_cache_data=list(zip(tensors[0::4], tensors[1::4]))),
                                    DynamicCache(ddp_cache_data=list(zip(tensors[2::4], tensors[3::4]))))
        cache.is_updated = dict.fromkeys(range(self.layers), True)  # the cross-attention part is full: read it
        key = tensors[2]
        hidden = key.new_zeros((key.shape[0], key.shape[2], self.hidden_size))
        result = self.model(**arguments, encoder_outputs=(hidden,), **{cache_argument(self.model): cache},
                            use_cache=True, return_dict=True)
        presents = _presents(returned_cache(result).self_attention_cache, "decoder.")
        return {**{name: result[name] for name in self.task.outputs}, **presents}


CALLS = {"head": HeadCall, "cached": CachedCall, "encoder": EncoderCall, "cached-decoder": CachedDecoderCall}


def _key_value_layers(torch, cache, model_type: str, task: Task) -> list:
    """A cache's layers, each holding a key and a value of (batch, heads, positions, head size);
    a model whose cache holds none (a state space model) has no task with past: exit 4."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(isinstance(getattr(layer, kind, None), torch.Tensor) and getattr(layer, kind).ndim == 4
                             for layer in layers for kind in ("keys", "values")):
        raise Incompatible(f"model type {model_type}: its cache ({type(cache).__name__}) holds no key and value "
                           f"per layer, so it has no {task.name} export", kind="target")
    return list(layers)


def _past_inputs(layers: list, part: str, positions: str) -> list[TaskInput]:
    """The past inputs of a cache's layers: `past_key_values.N.<part>key` and `.value`, in each
    layer's heads and head size, over `positions`."""
    inputs = []
    for index, layer in enumerate(layers):
        for kind, tensor in (("key", layer.keys), ("value", layer.values)):
            _, heads, _, size = tensor.shape
            inputs.append(TaskInput(f"{PAST}{index}.{part}{kind}", str(tensor.dtype).removeprefix("torch."),
                                    ("batch_size", heads, positions, size), "normal"))
    return inputs


def _presents(cache, part: str) -> dict:
    """A cache's keys and values as present outputs: `present.N.<part>key` and `.value`."""
    presents = {}
    for index, layer in enumerate(getattr(cache, "layers", None) or []):
        presents[f"{PRESENT}{index}.{part}key"], presents[f"{PRESENT}{index}.{part}value"] = layer.keys, layer.values
    return presents


def _first_step(torch, model, task: Task) -> tuple[dict, Any]:
    """An encoder-decoder's first decoder step, with its cache, on one row of what its encoder takes
    (model_tasks.ENCODERS, by its main input, at the example's sizes) and one decoder token: where
    the calls read their caches' shapes at load. Returns its encoder inputs, by keyword, and its result."""
    sizes = {**_sizes(model, task), "batch_size": 1}
    probe = {spec.keyword: torch.from_numpy(_example(spec, model.config, sizes))
             for spec in ENCODERS[getattr(model, "main_input_name", "input_ids")]}
    with torch.no_grad():
        return probe, model(**probe, decoder_input_ids=torch.zeros((1, 1), dtype=torch.long), use_cache=True,
                            return_dict=True)


def _cross_attentions(torch, model, task: Task) -> tuple[list, dict, Any]:
    """The decoder's cross-attention modules in the order it calls them: the innermost modules
    called with `key_value_states`, seen on its first step (returned with _first_step's)."""
    called = []

    def record(module, args, kwargs):
        if kwargs.get("key_value_states") is not None:
            called.append(module)

    hooks = [module.register_forward_pre_hook(record, with_kwargs=True) for module in model.get_decoder().modules()]
    try:
        probe, result = _first_step(torch, model, task)
    finally:
        for hook in hooks:
            hook.remove()
    innermost = [module for module in called
                 if not any(other is not module and other in set(module.modules()) for other in called)]
    return innermost, probe, result


def _sizes(model, task: Task) -> dict[str, int]:
    config, limit = model.config, stated_length_limit(model) or 512
    image = getattr(config, "image_size", 32)
    image = image if isinstance(image, int) else image[0]
    sizes = {**EXAMPLE_SIZES, **(PAST_SIZES if task.past else {}),
             "num_channels": getattr(config, "num_channels", 3), "height": image, "width": image,
             "feature_size": getattr(config, "num_mel_bins", 80),
             # Whisper's frames (twice its positions: a stride-2 convolution); a text encoder's tokens, 16
             "encoder_sequence_length": 2 * getattr(config, "max_source_positions", EXAMPLE_SIZES["sequence_length"])}
    sizes["sequence_length"] = min(sizes["sequence_length"], limit)
    return sizes


def padding_sides_of(folder: Path) -> tuple[str, ...]:
    """The side the folder's tokenizer pads on (its `padding_side`); both sides where it has none
    to say so."""
    if not any((folder / name).is_file() for name in ("tokenizer_config.json", "tokenizer.json")):
        return PADDING_SIDES
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception:  # noqa: BLE001 - a tokenizer that does not load says nothing of its padding
        return PADDING_SIDES
    return (tokenizer.padding_side,) if tokenizer.padding_side in PADDING_SIDES else PADDING_SIDES


def _example(spec: TaskInput, config, sizes: dict[str, int], sides: tuple[str, ...] = ("right",)) -> np.ndarray:
    """A seeded example of one input, its sizes from the config where it has them; a padding mask's
    last rows padded, a row on each of `sides` (from the last row up)."""
    rng = np.random.default_rng(0)
    shape = tuple(sizes[axis] if isinstance(axis, str) else axis for axis in spec.axes)
    if spec.values == "tokens":
        vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", 100)
        return rng.integers(0, vocab, size=shape).astype(spec.dtype)
    if spec.values == "mask":
        mask = np.ones(shape, spec.dtype)
        padded = shape[-1] - shape[-1] * 3 // 4  # a quarter of the positions
        for row, side in zip(range(shape[0] - 1, -1, -1), sides):
            if side == "right":
                mask[row, ..., shape[-1] - padded:] = 0
            else:
                mask[row, ..., :padded] = 0
        return mask
    if spec.values == "zeros":
        return np.zeros(shape, spec.dtype)
    if spec.values == "positions":  # the new tokens' positions, after the cached ones
        past = sizes.get("past_sequence_length", 0)
        return np.broadcast_to(np.arange(past, past + shape[-1]), shape).astype(spec.dtype)
    return rng.standard_normal(shape).astype(spec.dtype)


def task_module(torch, model, inputs: list[TaskInput], task: Task, call: HeadCall):
    """`model` as a module taking `inputs` (positionally or by keyword, by name) and returning
    {output name: tensor} as `call` makes them."""
    names = [spec.name for spec in inputs]
    keywords = {spec.name: spec.keyword for spec in inputs}

    class TaskModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.config = model.config
            self.train(model.training)
            self.keywords = keywords  # input name -> the model's keyword for it

        def forward(self, *args, **kwargs):
            given = {**dict(zip(names, args)), **kwargs}
            return call({keywords[name]: value for name, value in given.items()})

    # Python names for the signature torch reads (a past input's own name has dots in it)
    TaskModel.forward.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(name.replace(".", "_"), inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in names])
    TaskModel.__name__ = TaskModel.__qualname__ = f"{type(model).__name__}For{task.name.title().replace('-', '')}"
    return TaskModel()
