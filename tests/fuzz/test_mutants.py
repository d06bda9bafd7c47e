"""Mutated artifacts (.onnx with and without external data, .tflite) through inspect, check and
verify: every one ends in a verdict or a one-line exit 2, never a traceback, crash or hang."""

import random
import shutil
import time

import pytest

from exporter import api
from verifiers.errors import ExportgateError
from fixtures.specs import torch_model
from verifiers.runtimes import isolation

pytestmark = pytest.mark.slow
MUTANTS = 300
SOURCE = torch_model("mlp_exact")
TARGETS = {"onnx": "ort-1.32", "tflite": "litert-2.3"}


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    folder = tmp_path_factory.mktemp("originals")
    made = {}
    for name, to, opset in (("onnx", "onnx", 17), ("onnx_external", "onnx", 18), ("tflite", "tflite", None)):
        out = folder / name / f"m.{to}"
        report = api.export(SOURCE, to=to, opset=opset, out=out)
        assert report.exit_code == 0, report.summary_lines()
        made[name] = out
    assert [p.name for p in made["onnx_external"].parent.iterdir() if p.suffix == ".data"]  # dynamo: external data
    return made


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    kind = rng.choice(["flip", "flip", "flip", "truncate", "splice", "zero"])
    if kind == "flip":
        for _ in range(rng.choice([1, 2, 4, 8, 16])):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == "truncate":
        del data[rng.randrange(1, len(data)):]
    elif kind == "splice":
        start = rng.randrange(len(data))
        data[start:start] = data[rng.randrange(len(data)):][:rng.randrange(1, 64)]
    else:
        start = rng.randrange(len(data))
        data[start:start + rng.randrange(1, 256)] = bytes(min(len(data) - start, 256))
    return bytes(data)


def _one_of_each(path, fmt):
    """inspect, check and verify on `path`: what each ended in."""
    outcomes = []
    try:
        api.inspect(path)
        outcomes.append(0)
    except ExportgateError as exc:
        outcomes.append(2 if exc.kind == "input" else 4)
    outcomes.append(api.check(path, target=TARGETS[fmt]).exit_code)
    outcomes.append(api.verify(path, source=SOURCE, batches=1).exit_code)
    return outcomes


@pytest.mark.parametrize("kind", ["onnx", "onnx_external", "tflite"])
def test_mutants_end_in_a_verdict_or_exit_2(originals, tmp_path, kind):
    original = originals[kind]
    fmt = original.suffix[1:]
    rng = random.Random(kind)
    seen = {0: 0, 1: 0, 2: 0, 3: 0, 4: 0}
    start = time.monotonic()
    with isolation.limits(timeout=60):
        for i in range(MUTANTS):
            folder = tmp_path / str(i)
            shutil.copytree(original.parent, folder)
            files = sorted(folder.iterdir())
            target = rng.choice(files) if kind == "onnx_external" else folder / original.name
            target.write_bytes(_mutate(rng, target.read_bytes()))
            for code in _one_of_each(folder / original.name, fmt):  # anything but ExportgateError propagates
                assert code in seen
                seen[code] += 1
            shutil.rmtree(folder)
    print(f"{kind}: {MUTANTS} mutants x inspect/check/verify in {time.monotonic() - start:.0f} s, exit codes {seen}")
    assert seen[2] > 0  # most mutants are unreadable, and say so
