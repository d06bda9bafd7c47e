"""MODEL specs loaded through the framework registry: builders, model files, what is refused."""

import numpy as np
import pytest

from exporter.frameworks import load_source
from exporter.sources import parse_input_spec
from fixtures.specs import torch_model
from verifiers.errors import BadInput


def test_torch_model_without_inputs_asks_for_them():
    with pytest.raises(BadInput, match="--input NAME:SHAPE:DTYPE"):
        load_source(torch_model("mlp_without_inputs"))
    source = load_source(torch_model("mlp_without_inputs"), [parse_input_spec("x:3x16:float32")])
    assert source.input_names == ["x"] and source.example is None


def test_exported_program_file(tmp_path):
    import torch

    import fixtures.models.torch_models as models

    model, example = models.mlp_exact()
    path = tmp_path / "mlp.pt2"
    torch.export.save(torch.export.export(model, example), path)
    source = load_source(str(path), trust_source=True)
    assert source.framework.name == "torch" and source.inputs[0].shape == (4, 16)
    names, _, outputs = source.run({source.input_names[0]: example[0].numpy()})
    np.testing.assert_allclose(outputs[0], model(*example).detach().numpy(), atol=1e-6)


def test_builder_returning_something_else(tmp_path):
    path = tmp_path / "odd.py"
    path.write_text("def build():\n    return 42\n")
    with pytest.raises(BadInput, match="expected a torch.nn.Module or a keras.Model"):
        load_source(f"{path}:build")
