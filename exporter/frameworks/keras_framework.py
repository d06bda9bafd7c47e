"""Keras 3 (TensorFlow backend) as a source framework: keras.Model from a builder or a .keras file."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from verifiers.errors import BadInput, one_line
from exporter.frameworks import Framework
from exporter.sources import InputSpec, Source
from verifiers.sizes import DynamicAxis, default_sizes, symbol_of


def prepare_keras_environment() -> None:
    """Keras must run on TensorFlow for tf2onnx and the TFLite converter; keep TF's C++ logs quiet."""
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class KerasFramework(Framework):
    name = "keras"
    extra = "keras"
    modules = ("keras", "tensorflow")
    suffixes = (".keras",)

    def prepare(self) -> None:
        prepare_keras_environment()

    def owns(self, obj: Any) -> bool:
        keras = sys.modules.get("keras")
        return keras is not None and isinstance(obj, keras.Model)

    def code_in(self, path: Path) -> str | None:
        """A Lambda layer: Keras stores its function as Python bytecode, which loading runs (keras'
        safe_mode refuses it), read off the archive's config.json before anything loads."""
        lambdas = sorted(_lambda_layers(_keras_config(path)))
        if not lambdas:
            return None
        return (f"Lambda layer {', '.join(lambdas)} holds Python bytecode that loading runs (Keras' safe_mode "
                "refuses it)")

    def load_file(self, path: Path, trusted: bool = False) -> Any:
        prepare_keras_environment()
        keras = self.require("keras")
        self._check_backend(keras)
        try:
            return keras.saving.load_model(str(path), safe_mode=not trusted)
        except Exception as exc:
            raise BadInput(f"{path}: not a loadable Keras model: {one_line(exc)}") from exc

    def _check_backend(self, keras) -> None:
        backend = keras.backend.backend()
        if backend != "tensorflow":
            raise BadInput(f"Keras runs on the {backend!r} backend; set KERAS_BACKEND=tensorflow")

    def make_source(self, spec, model, example, input_specs, default_inputs):

        keras = self.require("keras")
        self._check_backend(keras)
        takes_dict = _takes_dict(model)
        try:
            struct = model.input if takes_dict else dict(zip((t.name for t in model.inputs), model.inputs))
            shapes = {name: list(t.shape) for name, t in struct.items()}
            dtypes = {name: str(t.dtype) for name, t in struct.items()}
        except (AttributeError, ValueError):
            shapes, dtypes = {}, {}  # an unbuilt Sequential model: its inputs come from the example or --input
        # None dimensions are dynamic: exported as dynamic and verified at several sizes, unless
        # --input fixes the input's shape (exporter.sources.apply_input_specs). Those nothing gives
        # a size get distinct ones from 2 up.
        dynamic = [DynamicAxis(name, k, symbol_of(None, k)) for name, shape in shapes.items()
                   for k, d in enumerate(shape) if d is None]
        sizes = default_sizes([a.symbol for a in dynamic])
        declared = [InputSpec(name, tuple(sizes[symbol_of(None, k)] if d is None else int(d)
                                          for k, d in enumerate(shape)), dtypes[name])
                    for name, shape in shapes.items()]
        by_keyword = isinstance(example, Mapping) or takes_dict
        arrays = None
        if example is not None:
            values = list(example.values()) if by_keyword else list(example)
            if by_keyword:
                names = list(example.keys())
            elif len(declared) == len(values):
                names = [s.name for s in declared]
            else:
                names = [f"input_{i}" for i in range(len(values))]
            arrays = {name: np.asarray(value) for name, value in zip(names, values)}
            declared = [InputSpec(n, tuple(a.shape), a.dtype.name) for n, a in arrays.items()]
        if declared:  # --input specs apply to them afterwards
            inputs = declared
        elif input_specs or (fallback := default_inputs()):
            inputs = list(input_specs or fallback)
        else:
            raise BadInput(
                f"{spec}: the Keras model has no defined inputs; start it with keras.Input, return "
                "(model, example_inputs) from the callable, or pass --input NAME:SHAPE:DTYPE"
            )
        names = {s.name for s in inputs}
        return Source(spec, self, model, inputs, arrays, by_keyword=by_keyword,
                      dynamic=[a for a in dynamic if a.input in names])

    def run(self, source, feed):
        arrays = [feed[name] for name in source.input_names]
        if source.by_keyword:
            result = source.model(dict(zip(source.input_names, arrays)), training=False)
        else:
            result = source.model(arrays[0] if len(arrays) == 1 else arrays, training=False)
        return keras_outputs(source.model, result)

    def activation_sites(self, source, feed):
        """Traced the way the export traces it (the serving function, inputs by name when the model
        takes them so), else with the model called on its inputs as a tensor or a list."""
        from verifiers.gelu.keras_sites import keras_activation_sites

        signature = self.tensor_signature(source)
        try:
            return keras_activation_sites(source.model, signature, call=self.serving_function(source, []))
        except Exception as first:  # noqa: BLE001 - fall back to the model called on a tensor or a list
            try:
                return keras_activation_sites(source.model, signature)
            except Exception:  # noqa: BLE001
                raise first from None

    def trace(self, source, feed):
        """The serving function traced as the routes trace it, frozen and run op by op
        (exporter.tracing.keras_trace)."""
        from exporter.tracing.keras_trace import trace_keras

        dynamic = {(axis.input, axis.axis) for axis in source.dynamic}
        return trace_keras(source, feed, self.tensor_signature(source, dynamic), self.serving_function(source, []))

    def parameters(self, source):
        found: dict[str, list[np.ndarray]] = {}
        for weight in source.model.weights:
            owner = getattr(weight, "path", weight.name).rpartition("/")[0]
            found.setdefault(owner, []).append(np.asarray(weight.numpy(), np.float32))
        return found

    def tensor_signature(self, source, dynamic: set[tuple[str, int]] = frozenset()) -> list:
        """tf.TensorSpecs of the source's inputs, named as the source names them; the (input, axis)
        pairs in `dynamic` become None."""
        tf = self.require("tensorflow")
        return [
            tf.TensorSpec([None if (spec.name, axis) in dynamic else dim for axis, dim in enumerate(spec.shape)],
                          tf.as_dtype(spec.dtype), name=spec.name)
            for spec in source.inputs
        ]

    def serving_function(self, source, output_names: list[str], weights_as_inputs: bool = False):
        """A function of the inputs (positionally, in the source's order) returning
        {output name: tensor}: traced, it gives artifacts the source's input and output names.

        weights_as_inputs: the function takes the model's variables after its inputs (those of
        `model_variables`, in that order) and computes with them (Keras' stateless_call), so a
        trace holds no weights."""
        model, names, by_keyword = source.model, source.input_names, source.by_keyword
        trainable = len(model.trainable_variables) if weights_as_inputs else 0

        def serve(*args):
            args, weights = args[:len(names)], args[len(names):]
            inputs = dict(zip(names, args)) if by_keyword else (args[0] if len(args) == 1 else list(args))
            if weights_as_inputs:
                result, _ = model.stateless_call(list(weights[:trainable]), list(weights[trainable:]), inputs,
                                                 training=False)
            else:
                result = model(inputs, training=False)
            values = list(result.values()) if isinstance(result, dict) else (
                list(result) if isinstance(result, (list, tuple)) else [result])
            return dict(zip(output_names or output_names_of(model, result)[0], values))

        return serve


def model_variables(model: Any) -> list:
    """A Keras model's variables in the order stateless_call takes them: trainable, then the rest."""
    return [*model.trainable_variables, *model.non_trainable_variables]


def _takes_dict(model: Any) -> bool:
    """Whether the model was built on a dict of inputs: it takes them by key only (a list would
    have to follow the keys' sorted order, not the order the model lists them in)."""
    try:
        return isinstance(model.input, Mapping)
    except (AttributeError, ValueError):  # never called: no defined input
        return False


def output_names_of(model: Any, result: Any) -> tuple[list[str], bool]:
    """Names for what a Keras model returned, and whether they are the model's own (dict keys,
    named functional outputs) rather than positions."""
    if isinstance(result, Mapping):
        return [str(k) for k in result], True
    count = len(result) if isinstance(result, (list, tuple)) else 1
    names = list(getattr(model, "output_names", None) or [])
    if len(names) == count and len(set(names)) == len(names):
        return names, True
    return (["output"] if count == 1 else [f"output_{i}" for i in range(count)]), False


def keras_outputs(model: Any, result: Any) -> tuple[list[str], bool, list[np.ndarray]]:
    """Name and flatten what a Keras model returned."""
    names, real = output_names_of(model, result)
    values = list(result.values()) if isinstance(result, Mapping) else (
        list(result) if isinstance(result, (list, tuple)) else [result])
    return names, real, [np.asarray(v) for v in values]


def _keras_config(path: Path) -> Any:
    """The model config a .keras archive holds (its config.json); BadInput for a file that is no such archive."""
    import json
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return json.loads(archive.read("config.json"))
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise BadInput(f"{path}: not a Keras 3 archive (a zip holding config.json): {one_line(exc)}") from exc


def _lambda_layers(config: Any) -> set[str]:
    """The names of the Lambda layers anywhere in a serialized Keras config."""
    found: set[str] = set()
    if isinstance(config, dict):
        if config.get("class_name") == "Lambda":
            found.add(str((config.get("config") or {}).get("name", "?")))
        for value in config.values():
            found |= _lambda_layers(value)
    elif isinstance(config, list):
        for value in config:
            found |= _lambda_layers(value)
    return found

