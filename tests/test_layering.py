"""The layering is a contract (pyproject.toml, [tool.importlinter]): verifiers never imports
exporter; runtimes and formats never import the GELU verdict; the CLI is the only importer of
typer; no module imports itself through others; only the runtimes package runs artifacts. lint-imports
reads the code's imports, function-level ones included."""

import sys
from pathlib import Path

from fixtures.children import run_child

REPO = Path(__file__).resolve().parents[1]
CONTRACTS = (
    "verifiers (the artifact layer) never imports exporter (the model layer)",
    "runtimes and formats never import the GELU verdict",
    "the CLI is the only importer of typer",
    "no import cycles among the product's modules",
    "only the runtimes package runs artifacts (onnxruntime, LiteRT and OpenVINO are imported there alone)",
)


def test_the_import_contracts_hold():
    result = run_child([Path(sys.executable).parent / "lint-imports", "--no-cache"], cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    for contract in CONTRACTS:
        assert f"{contract} KEPT" in " ".join(result.stdout.split()), result.stdout[-4000:]
