"""Target runtimes and devices as the matrix describes them: what each supports, every fact with
its source (verifiers.target_matrix reads opset_matrix.yaml into these)."""

from __future__ import annotations

from dataclasses import dataclass

# The version limits a target may state (which ones a format's targets have: verifiers.formats).
LIMIT_FIELDS = ("max_opset", "max_ir_version", "max_runtime_version")


@dataclass(frozen=True)
class Source:
    fact: str
    source: str
    quote: str


@dataclass(frozen=True)
class OpGap:
    op: str
    note: str


@dataclass(frozen=True)
class Target:
    """One runtime or device. A gelu flag of None means the matrix makes no claim."""

    name: str
    format: str
    runtime: str
    version: str
    max_opset: int | None  # onnx targets
    max_ir_version: int | None  # onnx targets: highest ONNX IR version the runtime loads; None when not sourced
    max_runtime_version: str | None  # tflite targets; None when not sourced
    gelu: dict[str, bool | None]
    dtypes: tuple[str, ...] | None
    op_gaps: tuple[OpGap, ...]
    sources: tuple[Source, ...]
    confirmed_by_test: tuple[str, ...]

    def fact_keys(self) -> set[str]:
        """The facts this entry claims: each needs a source."""
        keys = {f"gelu.{flag}" for flag, value in self.gelu.items() if value is not None}
        keys |= {limit for limit in LIMIT_FIELDS if getattr(self, limit) is not None}
        if self.dtypes is not None:
            keys.add("dtypes")
        if self.op_gaps:
            keys.add("op_gaps")
        return keys
