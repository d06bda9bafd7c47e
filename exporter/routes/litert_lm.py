"""PyTorch -> TFLite for a decoder with its KV cache: litert-torch's `export_hf`, the LLM form
LiteRT-LM runs (verifiers.runtimes.litert_lm): signatures `prefill_<T>` and `decode` over a cache
of fixed length, float32 weights (quantization_recipe "none": left unset, export_hf quantizes
weights to int8). The prefill returns the logits of its last position too (prefill_logits): without
them the last layer's MLP computes nothing the prefill returns and is dropped from it, and the GELU
guard, which reads the first subgraph (the prefill), would find sites of the source missing.

It reads the model folder itself (the source stays loaded for the reference generation), and its
tokenizer: a folder without `tokenizer.json` or `tokenizer_config.json` cannot go this way. The
cache holds min(max_position_embeddings, 4096) positions, litert-torch's default; prefill takes
chunks of min(128, cache / 2) tokens. Its tokenizer output and `.litertlm` packaging are not part
of the artifact: the folder's own files are published beside it.

What export_hf's KV cache reads of the config (litert_torch/generative/export_hf/core/cache.py:
num_key_value_heads, num_attention_heads, hidden_size, num_hidden_layers) is checked first, before
the tokenizer, so a model type it does not export (GPT-2: no num_key_value_heads) is one exit 4
saying what to do instead; one that fails later in its loading or tracing is exit 4 with
export_hf's error.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from verifiers.errors import Incompatible, one_line
from exporter.routes import ExportRequest, ExportResult, Route
from exporter.routes.torch_tflite import litert_torch_quiet, require_litert_torch
from exporter.sources import Source, stated_length_limit

CACHE_LENGTH, PREFILL_LENGTH = 4096, 128  # litert-torch's defaults, bounded by the model's positions
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# The config attributes export_hf's KV cache reads (litert_torch/generative/export_hf/core/cache.py).
CACHE_CONFIG = ("num_key_value_heads", "num_attention_heads", "hidden_size", "num_hidden_layers")
INSTEAD = "export for --task text-generation (no cache, fixed sizes) or --to onnx"


class TorchToLiteRtLm(Route):
    framework = "torch"
    format = "tflite"
    exporters = ("litert-torch export_hf",)
    calls = ("cached",)  # decoder-only LLMs: export_hf writes no encoder-decoder

    def export(self, source: Source, request: ExportRequest, dest: Path, progress) -> ExportResult:
        litert_torch = require_litert_torch()
        folder = Path(source.spec)
        described = f"model type {source.facts.get('model_type')}, task {source.facts.get('task')}"
        config = getattr(source.model, "config", None)
        missing = [name for name in CACHE_CONFIG if getattr(config, name, None) is None]
        if missing:
            raise Incompatible(f"{described}: litert-torch's export_hf cannot export it: its KV cache reads "
                               f"{', '.join(missing)}, which the model's config does not have; {INSTEAD}")
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            raise Incompatible(f"{described}: litert-torch's export_hf reads the folder's tokenizer, and {folder} has "
                               f"no {' or '.join(TOKENIZER_FILES)}; save the tokenizer into it (save_pretrained), "
                               f"or {INSTEAD}")
        cache = min(CACHE_LENGTH, stated_length_limit(source.model) or CACHE_LENGTH)
        prefill = min(PREFILL_LENGTH, cache // 2)
        progress(f"exporting with litert-torch export_hf: prefill {prefill} tokens, cache {cache} positions")
        with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".export_hf-") as work:
            try:
                # stderr too: its import checks transformers' docstrings aloud, its loading draws tqdm bars
                with litert_torch_quiet(litert_torch) as printed, contextlib.redirect_stderr(printed), \
                        _kernel_decorator_patched() as export_hf:
                    export_hf.export(model=str(folder), output_dir=work, prefill_lengths=[prefill],
                                     cache_length=cache, quantization_recipe="none", prefill_logits=True,
                                     bundle_litert_lm=False, keep_temporary_files=True, trust_remote_code=False)
            except Exception as exc:
                raise Incompatible(f"{described}: litert-torch's export_hf cannot export it: {one_line(exc)}; "
                                   f"{INSTEAD}") from exc
            written = Path(work) / "model.tflite"
            if not written.is_file():
                raise Incompatible(f"{described}: litert-torch's export_hf wrote no model.tflite")
            shutil.move(str(written), dest)
        return ExportResult(
            exporter="litert-torch export_hf",
            notes=[(f"an LLM of signatures prefill_{prefill} and decode over a cache of {cache} positions, batch 1: "
                    "verified by generating (the source's inputs map to none of its signatures)")])


@contextlib.contextmanager
def _kernel_decorator_patched():
    """litert-torch's export_hf module, with transformers' `use_kernel_forward_from_hub` patched as
    its import patches it (a model type whose modeling module is imported under it gets
    litert-torch's RMSNorm, made of ops only its converter knows) for the export's time alone;
    before and after, the decorator is transformers' own, so a model type imported later in this
    process (a folder exported to ONNX next) is transformers' (litert_torch/generative/export_hf/
    core/patches.py keeps both)."""
    import transformers.integrations as integrations
    from litert_torch.generative.export_hf import export as export_hf
    from litert_torch.generative.export_hf.core import patches

    integrations.use_kernel_forward_from_hub = patches._use_kernel_forward_from_hub
    try:
        yield export_hf
    finally:
        integrations.use_kernel_forward_from_hub = patches.original_use_kernel_forward_from_hub
