"""Artifact formats (ONNX, TFLite) behind one interface, found through a lazy registry.

A format is a package here (verifiers.formats.onnx, verifiers.formats.tflite). It recognises its
files, opens one into an `Artifact` (read once from disk; every step passes the same object
along), knows what the matrix says of its targets, reads its graph for localisation and runs an
int8 artifact's layers against a float model's. An artifact lists
its companion files, describes itself, gives its facts for the report, finds its GELU sites and
checks itself against a target. A new format is one module here and one line in FORMATS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from verifiers.errors import BadInput
from verifiers.registry import LazyRegistry
from verifiers.report import Report


class Artifact:
    """One artifact file, parsed at most once. Subclasses hold the parsed structure."""

    gelu_rewritable = False  # whether `gelu_swapped` can write a site's GELU as another flavour

    @property
    def generates_by_signatures(self) -> bool:
        """Whether it is an LLM of prefill and decode signatures (verifiers.runtimes.litert_lm):
        the source's inputs map to none of them, so it is verified by generating only."""
        return False

    def __init__(self, path: str | Path, fmt: "ArtifactFormat"):
        self.path = Path(path)
        self.format = fmt

    def companion_files(self) -> list[str]:
        """Files that travel with the artifact, relative to its folder (none by default)."""
        return []

    def relocate_companions(self, old_to_new: dict[str, str]) -> None:
        """Make the artifact name its companion files by new names (the files are not touched)."""
        raise NotImplementedError(f"{self.format.title} artifacts have no companion files")

    def size_bytes(self) -> int:
        """The artifact and its companion files, on disk."""
        return self.path.stat().st_size + sum((self.path.parent / n).stat().st_size for n in self.companion_files())

    def describe(self) -> dict[str, Any]:
        """What `exportgate inspect` shows, without the GELU sites."""
        raise NotImplementedError

    def record_facts(self, report: Report) -> None:
        """What the report records about the artifact (its opset, its minimum runtime version)."""
        raise NotImplementedError

    def shape_constants(self) -> list[tuple[str, str, list[int]]]:
        """(node, op, values) for every constant shape an op of the artifact reads (a Reshape's
        target shape): sizes fixed when it was made. None known by default."""
        return []

    def activation_sites(self, runner: type | None = None) -> list:
        """The GELU and ReLU sites in graph order, GELUs measured on the probes in `runner`'s
        runtime (a verifiers.runtimes Runner class; the format's default when None). Run it in a
        runtime worker: the measuring runs the artifact's subgraphs."""
        raise NotImplementedError

    def precision(self) -> Any:
        """How the artifact computes (verifiers.precision.Precision): its mode, its inputs' and
        outputs' quantization and every op that computes on a float tensor."""
        raise NotImplementedError

    def input_ranges(self) -> dict[str, tuple[float, float]]:
        """The real range each input of a quantized artifact can take (what its calibration chose:
        values beyond are clamped), by input name; {} where none is quantized."""
        return {}

    def int8_spec_violations(self) -> list | None:
        """Where a quantized artifact departs from its format's int8 quantization spec; None where
        no such spec is checked (the report then has no spec_violations field)."""
        return None

    def check_target(self, target: Any) -> list:
        """Every incompatibility (verifiers.target_check.Incompatibility) with a target
        (verifiers.targets.Target) of this format."""
        raise NotImplementedError

    def gelu_swapped(self, sites: list) -> Any | None:
        """The artifact with every exact GELU written as tanh and every tanh as exact, in a form its
        runtime loads with the artifact's folder as its data folder (None when the format cannot be
        rewritten or has no such site). Raises ValueError for a site the rewrite cannot isolate."""
        return None


class ArtifactFormat:
    name: str  # "onnx": the --to value and the report's format field
    title: str  # "ONNX", in messages
    article: str  # "an" ONNX artifact
    suffixes: tuple[str, ...]
    artifact_class: type[Artifact]
    # What opset_matrix.yaml says of its targets: the version-limit field, the other fields, the gelu flags.
    target_limit: str
    target_fields: tuple[str, ...] = ()
    gelu_flags: tuple[str, ...] = ()

    def recognises(self, head: bytes) -> bool:
        """Whether a file starting with these bytes is of this format (for a file without its suffix)."""
        raise NotImplementedError

    def open(self, path: str | Path) -> Artifact:
        return self.artifact_class(path, self)

    def target_limits(self, raw: dict, fail: Callable[[str, str], BadInput]) -> dict[str, Any]:
        """The version limits of a matrix entry of this format, validated (Target field -> value)."""
        raise NotImplementedError

    def limit_text(self, target: dict[str, Any]) -> str:
        """The version limit of a target, as `exportgate targets` prints it."""
        raise NotImplementedError

    def headline(self, info: dict[str, Any]) -> list[str]:
        """The first lines `exportgate inspect` prints for `describe()`'s facts."""
        raise NotImplementedError

    def localization_graph(self, path: Path) -> Any:
        """The artifact's graph as localisation reads and runs it (a
        verifiers.localization.graph.ArtifactGraph)."""
        raise NotImplementedError

    def layer_errors(self, quantized: Path, float_model: Path | None, feeds: list[dict], runner_class: type) -> Any:
        """An int8 artifact's quantized tensors against the float model's, both run by
        `runner_class` (a verifiers.quantization.layers.LayerDiagnosis)."""
        raise NotImplementedError

    def variant_model(self, path: Path, variant: str, folder: Path) -> Path:
        """The artifact as a runtime variant runs it (Runner.arithmetic: float16 emulated), written
        into `folder`, for the localisation to look inside."""
        raise NotImplementedError(f"{self.name} artifacts have no {variant} variant to look inside")


FORMATS: LazyRegistry[ArtifactFormat] = LazyRegistry("artifact format", {
    "onnx": "verifiers.formats.onnx:OnnxFormat",
    "tflite": "verifiers.formats.tflite:TfliteFormat",
}, instantiate=True)


def artifact_format(name: str) -> ArtifactFormat:
    return FORMATS.get_or_fail(name, "--to")


def detect_format(path: str | Path) -> ArtifactFormat:
    """The format of a file, by suffix, then by its first bytes."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    for fmt in FORMATS.values():
        if path.suffix in fmt.suffixes:
            return fmt
    with open(path, "rb") as fh:
        head = fh.read(8)
    for fmt in FORMATS.values():
        if fmt.recognises(head):
            return fmt
    names = " nor ".join(f"{f.article} {f.title}" for f in FORMATS.values())
    suffixes = " or ".join(s for f in FORMATS.values() for s in f.suffixes)
    raise BadInput(f"{path}: neither {names} file (use a {suffixes} suffix)")


def open_artifact(path: str | Path) -> Artifact:
    """The artifact at `path`, its format detected."""
    return detect_format(path).open(path)


_LAST_OPENED: dict[str, Any] = {}


def opened(fmt: str, path: str | Path) -> Artifact:
    """The artifact at `path`, parsed once per process while the file stays as it is (same size
    and modification time): what a runtime worker does with one artifact (measure its GELU sites,
    run its GELU-swapped variant) shares one parse. Callers must not change the parsed model."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path}: no such file")
    info = path.stat()
    key = (fmt, str(path.resolve()), info.st_size, info.st_mtime_ns)
    if _LAST_OPENED.get("key") != key:
        _LAST_OPENED.update(key=key, artifact=FORMATS[fmt].open(path))
    return _LAST_OPENED["artifact"]


def measured_sites(fmt: str, path: Path, runner: type | None = None) -> list:
    """`activation_sites` of the artifact at `path` (a module-level function, for a runtime worker)."""
    return opened(fmt, path).activation_sites(runner)


