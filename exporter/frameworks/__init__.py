"""Source frameworks (PyTorch, Keras), found through a registry, and `load_source`, which turns a
MODEL spec into a Source through them.

A framework knows how to recognise its model objects without importing itself, how to load its
model files, how to describe a model's inputs and how to run the model on numpy arrays. Nothing
else in exportgate imports a user's file.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from exporter.source_files import recording
from exporter.sources import InputSpec, Source, apply_input_specs, set_aside_imported_objects
from verifiers.errors import BadInput, MissingFramework, raised
from verifiers.registry import LazyRegistry


class Framework:
    name: str
    extra: str  # the exportgate extra that installs it
    modules: tuple[str, ...]  # top-level module names
    suffixes: tuple[str, ...] = ()  # model files it loads
    # Why loading its model files can run code the file carries (None: it cannot); such files
    # load only with --trust-source.
    load_runs_code: str | None = None

    def code_in(self, path: Path) -> str | None:
        """Why loading the model file at `path` would run code it carries (None: it would not);
        by default the framework's load_runs_code, whatever the file holds."""
        return self.load_runs_code

    def prepare(self) -> None:
        """Set what the framework reads at import (environment variables), before anything imports it."""

    def owns(self, obj: Any) -> bool:
        raise NotImplementedError

    def load_file(self, path: Path, trusted: bool = False) -> Any:
        """The model in the file; `trusted`: --trust-source, so code the file carries may run."""
        raise NotImplementedError

    def make_source(
        self, spec: str, model: Any, example: Any, input_specs: list[InputSpec],
        default_inputs: Callable[[], list[InputSpec]],
    ) -> Source:
        """`default_inputs()` gives input specs read off an artifact (called only when the model
        has neither example inputs, declared inputs nor --input specs)."""
        raise NotImplementedError

    def run(self, source: Source, feed: dict[str, np.ndarray]) -> tuple[list[str], bool, list[np.ndarray]]:
        raise NotImplementedError

    def activation_sites(self, source: Source, feed: dict[str, np.ndarray]) -> list:
        """The source's GELU and ReLU sites (verifiers.gelu Site records) in graph order."""
        raise NotImplementedError

    def trace(self, source: Source, feed: dict[str, np.ndarray]):
        """What the source computes on one feed, op by op, with each op's module and source line
        (a verifiers.localization.trace.SourceTrace), for localising a divergence; None where the
        framework cannot tell."""
        return None

    def parameters(self, source: Source) -> dict[str, list[np.ndarray]]:
        """The source's weights by the module (layer) holding them, as arrays."""
        return {}

    def require(self, module: str):
        """Import one of this framework's modules, or say which pip command installs it."""
        import importlib

        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise MissingFramework(module.split(".")[0], self.extra) from exc


FRAMEWORKS: LazyRegistry[Framework] = LazyRegistry("framework", {
    "torch": "exporter.frameworks.torch_framework:TorchFramework",
    "keras": "exporter.frameworks.keras_framework:KerasFramework",
}, instantiate=True)


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


def framework_named_by(spec: str) -> str | None:
    """The framework a MODEL spec names before anything loads: a transformers model folder's
    (torch), a model file's by its suffix; None for file.py:callable (its object tells)."""
    from exporter.model_folders import is_model_folder

    if is_model_folder(Path(spec)):
        return "torch"
    path_text, sep, _ = spec.rpartition(":")
    if sep and path_text.endswith(".py"):
        return None
    return next((f.name for f in FRAMEWORKS.values() if Path(spec).suffix in f.suffixes), None)


def load_source(
    spec: str, input_specs: list[InputSpec] | None = None,
    default_inputs: Callable[[], list[InputSpec]] | None = None, trust_source: bool = False,
    task: str | None = None,
) -> Source:
    """Load `file.py:callable`, `model.keras`, `model.pt2` or a transformers model folder (for
    `task`, see exporter.model_folders).

    `default_inputs()` (input specs read off an artifact being verified, asked for only when
    needed) serve a model that comes with neither example inputs nor --input specs. A model file whose loading can run code (a .pt2) loads
    only with `trust_source`; a file.py runs by design.
    """
    for framework in FRAMEWORKS.values():
        framework.prepare()  # before a user's file imports the framework
    set_aside_imported_objects()
    input_specs = list(input_specs or [])
    from exporter.model_folders import is_model_folder

    if is_model_folder(Path(spec)):
        return _load_folder(spec, input_specs, default_inputs or list, trust_source, task)
    if task is not None:
        raise BadInput(f"--task {task}: applies to a transformers model folder (a directory holding config.json), "
                       f"not {spec}")
    path_text, sep, attr = spec.rpartition(":")
    spec_file = Path(path_text if sep and path_text.endswith(".py") else spec)
    with recording() as files:
        if sep and path_text.endswith(".py"):
            model, example = _call_builder(spec_file, attr)
            framework = framework_for_object(model)
        else:
            path = spec_file
            if not path.exists():
                raise BadInput(f"{spec}: no such file")
            framework = framework_for_file(path)
            code = framework.code_in(path)
            if code and not trust_source:
                raise BadInput(f"{spec}: {code}; pass --trust-source to load a file you trust")
            model, example = framework.load_file(path, trusted=trust_source), None
    source = framework.make_source(spec, model, example, input_specs, default_inputs or list)
    apply_input_specs(source, input_specs, source.dynamic)
    # The spec file always: a module loaded before in this process may be re-run from its bytecode.
    source.files = sorted({*files, spec_file.resolve()})
    return source


def _load_folder(spec: str, input_specs: list[InputSpec], default_inputs, trust_source: bool,
                 task: str | None) -> Source:
    from exporter.model_folders import load_folder, read_folder
    from verifiers.gelu.configured import declared_by

    framework = FRAMEWORKS["torch"]
    framework.require("torch")
    if importlib.util.find_spec("transformers") is None:
        raise MissingFramework("transformers", "hf")
    folder = read_folder(Path(spec), task, trust_source)
    with recording() as files:
        model, example, dynamic = load_folder(folder, trust_source)
    if all(name.isidentifier() for name in example):
        source = framework.make_source(spec, model, example, [], default_inputs)
    else:  # called positionally (a past input's name is no Python name); the inputs keep their names
        source = framework.make_source(spec, model, tuple(example.values()), [], default_inputs)
        source.inputs = [dataclasses.replace(s, name=name) for s, name in zip(source.inputs, example)]
        source.example = dict(example)
    apply_input_specs(source, input_specs, dynamic)
    source.files = sorted({*files, *(f.resolve() for f in folder.files)})
    source.facts = {"model_type": folder.model_type, "task": folder.task.name}
    source.configured = declared_by(folder.config)
    source.beside = folder.processing
    return source


def _module_name(path: Path) -> str:
    """The name a user's file is imported under: its stem, so class paths in artifacts (TFLite
    tensor names) read as the user wrote them, unless that would shadow or be shadowed by another
    module; then a name unique to the file."""
    stem, resolved = path.stem, path.resolve()
    existing = sys.modules.get(stem)
    if stem.isidentifier():
        if existing is None and importlib.util.find_spec(stem) is None:
            return stem
        if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == resolved:
            return stem
    return f"_exportgate_user_{abs(hash(resolved))}"


def user_callable(path: Path, attr: str, label: str = "") -> Any:
    """The callable `attr` of the user's file at `path`, imported as a module of its own (a
    missing framework named as such); `label` starts every error (default: the path)."""
    label = label or str(path)
    if not path.is_file():
        raise BadInput(f"{label}: no such file")
    if not attr.isidentifier():
        raise BadInput(f"{label}:{attr}: {attr!r} is not a callable name")
    module_name = _module_name(path)
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except ImportError as exc:
        _raise_missing_framework(exc)
        raise BadInput(f"{label}: import failed: {raised(exc)}") from exc
    except Exception as exc:
        raise BadInput(f"{label}: failed to load: {raised(exc)}") from exc
    function = getattr(module, attr, None)
    if function is None:
        raise BadInput(f"{label}: no callable named {attr!r}")
    if not callable(function):
        raise BadInput(f"{label}:{attr} is not callable")
    return function


def _call_builder(path: Path, attr: str) -> tuple[Any, Any]:
    builder = user_callable(path, attr)
    try:
        built = builder()
    except Exception as exc:
        raise BadInput(f"{path}:{attr}() raised {raised(exc)}") from exc
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[1], (tuple, list, dict)):
        return built[0], built[1]
    return built, None


def _raise_missing_framework(exc: ImportError) -> None:
    missing = getattr(exc, "name", None) or ""
    for framework in FRAMEWORKS.values():
        if missing.split(".")[0] in framework.modules:
            raise MissingFramework(missing.split(".")[0], framework.extra) from exc


