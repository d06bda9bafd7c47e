"""Source frameworks (PyTorch, Keras), found through a registry.

A framework knows how to recognise its model objects without importing itself, how to load its
model files, how to describe a model's inputs and how to run the model on numpy arrays.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from verifiers.errors import BadInput, MissingFramework

if TYPE_CHECKING:
    from exporter.sources import InputSpec, Source


class Framework:
    name: str
    extra: str  # the exportgate extra that installs it
    modules: tuple[str, ...]  # top-level module names
    suffixes: tuple[str, ...] = ()  # model files it loads
    # Why loading its model files can run code the file carries (None: it cannot); such files
    # load only with --trust-source.
    load_runs_code: str | None = None

    def owns(self, obj: Any) -> bool:
        raise NotImplementedError

    def load_file(self, path: Path) -> Any:
        raise NotImplementedError

    def make_source(
        self, spec: str, model: Any, example: Any, input_specs: list["InputSpec"], default_inputs: list["InputSpec"]
    ) -> "Source":
        raise NotImplementedError

    def run(self, source: "Source", feed: dict[str, np.ndarray]) -> tuple[list[str], bool, list[np.ndarray]]:
        raise NotImplementedError

    def activation_sites(self, source: "Source", feed: dict[str, np.ndarray]) -> list:
        """The source's GELU and ReLU sites (verifiers.gelu Site records) in graph order."""
        raise NotImplementedError

    def require(self, module: str):
        """Import one of this framework's modules, or say which pip command installs it."""
        import importlib

        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise MissingFramework(module.split(".")[0], self.extra) from exc


FRAMEWORKS: dict[str, Framework] = {}


def register(cls: type[Framework]) -> type[Framework]:
    FRAMEWORKS[cls.name] = cls()
    return cls


def framework_for_object(obj: Any) -> Framework:
    for framework in FRAMEWORKS.values():
        if any(m in sys.modules for m in framework.modules) and framework.owns(obj):
            return framework
    raise BadInput(
        f"the callable returned a {type(obj).__module__}.{type(obj).__qualname__}; expected a "
        "torch.nn.Module or a keras.Model, or a pair (model, example_inputs)"
    )


def framework_for_file(path: Path) -> Framework:
    for framework in FRAMEWORKS.values():
        if path.suffix in framework.suffixes:
            return framework
    known = sorted(s for f in FRAMEWORKS.values() for s in f.suffixes)
    raise BadInput(f"{path}: unknown model file type (expected file.py:callable or one of {', '.join(known)})")


from exporter.frameworks import keras_framework, torch_framework  # noqa: E402,F401  (registration)
