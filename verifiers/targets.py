"""Target runtimes and devices as the matrix describes them: what each supports, every fact with
its source (verifiers.target_matrix reads opset_matrix.yaml into these)."""

from __future__ import annotations

from dataclasses import dataclass

# The version limits a target may state (which ones a format's targets have: verifiers.formats).
LIMIT_FIELDS = ("max_opset", "max_ir_version", "max_runtime_version")
# The rank rules a target may state for activation tensors (tflite targets: verifiers.formats).
RANK_FIELDS = ("max_rank", "max_inner_dims")
# The integer activation dtypes an integer_only target may list.
INTEGER_DTYPES = ("int8", "uint8", "int16", "uint16")
# What a target computes an artifact's float16 ops in: float16 itself, or float32 (cast up).
FLOAT16_ARITHMETIC = ("float16", "float32")


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
    # Integer devices. integer_only: runs only full-integer models, their activations of one of
    # integer_dtypes (given exactly when integer_only is true); static_shapes: no dynamic
    # dimension; max_rank: no activation tensor of more dimensions; max_inner_dims: only that many
    # innermost dimensions of an activation tensor may be larger than 1; ops: the only ops it runs.
    integer_only: bool | None = None
    integer_dtypes: tuple[str, ...] = ()
    static_shapes: bool | None = None
    max_rank: int | None = None
    max_inner_dims: int | None = None
    ops: tuple[str, ...] | None = None
    # What float16 ops of an artifact compute in there (FLOAT16_ARITHMETIC); None: no claim.
    float16: str | None = None

    def fact_keys(self) -> set[str]:
        """The facts this entry claims: each needs a source."""
        keys = {f"gelu.{flag}" for flag, value in self.gelu.items() if value is not None}
        keys |= {field for field in (*LIMIT_FIELDS, *RANK_FIELDS, "integer_only", "static_shapes", "ops", "float16")
                 if getattr(self, field) is not None}
        if self.dtypes is not None:
            keys.add("dtypes")
        if self.op_gaps:
            keys.add("op_gaps")
        return keys
