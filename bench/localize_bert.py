"""Localisation's cost on BERT-base: `exportgate verify` of a faulted BERT-base ONNX (torch.onnx's
dynamo export, one weight of a MatMul perturbed as fixtures/inject_faults.py does) localising the
red run, beside the same verify with --no-localize. Both exit 1; the first also loads the source
again, traces it op by op and runs the artifact twice with every tensor kept.

    python bench/localize_bert.py [--rounds 3]

Goal (issue 23): wall <= 3x and peak RSS (process tree) <= 1.5x the plain verify.
"""

import argparse
import sys
import tempfile
from pathlib import Path

from side_by_side import EXPORTGATE, REPO, compare, run_once

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
model = str(REPO / "bench" / "models.py") + ":bert_base"
with tempfile.TemporaryDirectory() as tmp:
    exported, faulty = f"{tmp}/bert.onnx", f"{tmp}/bert-faulty.onnx"
    run_once([*EXPORTGATE, "export", model, "--to", "onnx", "--out", exported], Path(tmp))
    run_once([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); "
              "from fixtures.inject_faults import inject_onnx; "
              f"print(inject_onnx({exported!r}, 'weight_perturbed', {faulty!r}))"], Path(tmp))
    verify = [*EXPORTGATE, "verify", faulty, "--source", model]
    compare([("verify, localising the red run", verify, "verify --no-localize", [*verify, "--no-localize"])],
            args.rounds, Path(tmp), goals={"verify, localising the red run": (3.0, 1.5)}, expect=1)
