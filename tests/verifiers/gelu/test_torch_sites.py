"""The PyTorch GELU site finder on real modules, recorded as they run (and a torch.export program)."""

import math

import pytest
import torch
import torch.nn.functional as F

from verifiers.gelu import (
    EXACT,
    QUICK,
    RELU,
    TANH,
    UNKNOWN,
    find_torch_relu_sites,
    find_torch_sites,
)


def gelu_new(x, cubic=0.044715):
    """HF gelu_new (GPT-2, T5), written out with torch.pow."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + cubic * torch.pow(x, 3.0))))


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class Mlp(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(8, 16), act, torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Layer(torch.nn.Module):
    def __init__(self, act):
        super().__init__()
        self.mlp = Mlp(act)

    def forward(self, x):
        return x + self.mlp(x)


class Encoder(torch.nn.Module):
    def __init__(self, *acts):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(a) for a in acts)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Model(torch.nn.Module):
    def __init__(self, *acts):
        super().__init__()
        self.encoder = Encoder(*acts)

    def forward(self, x):
        return self.encoder(x)


class ConvStem(torch.nn.Module):
    """Whisper's conv stem: F.gelu called inside forward, no GELU module."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(8, 8, 3, stride=2, padding=1)

    def forward(self, x):
        return F.gelu(self.conv2(F.gelu(self.conv1(x))))


def sites(module, *args, **kwargs):
    torch.manual_seed(0)
    return find_torch_sites(module.eval(), args or (torch.randn(2, 8),), kwargs or None)


@pytest.mark.parametrize(
    ("act", "op", "claimed"),
    [
        pytest.param(torch.nn.GELU(), "aten.gelu", EXACT, id="nn.GELU"),
        pytest.param(torch.nn.GELU(approximate="tanh"), "aten.gelu", TANH, id="nn.GELU-tanh"),
        pytest.param(Fn(F.gelu), "aten.gelu", EXACT, id="F.gelu"),
        pytest.param(Fn(lambda x: F.gelu(x, approximate="tanh")), "aten.gelu", TANH, id="F.gelu-tanh"),
        pytest.param(Fn(gelu_new), "tanh-chain", TANH, id="gelu_new"),
        pytest.param(Fn(lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))), "erf-chain", EXACT,
                     id="erf-by-hand"),
        pytest.param(Fn(lambda x: x * torch.sigmoid(1.702 * x)), "sigmoid-chain", QUICK, id="quick_gelu"),
        pytest.param(Fn(lambda x: gelu_new(x, 0.0447)), "tanh-chain", UNKNOWN, id="0.0447-typo"),
    ],
)
def test_finds_the_one_gelu_between_the_linears(act, op, claimed):
    [site] = sites(Mlp(act))
    assert (site.op, site.claimed) == (op, claimed)
    assert site.site_id == f"0:{site.nodes[0]}"
    assert site.input == "addmm"  # fc1's output, as the recorded aten call names it
    assert "in act (" in site.note


def test_gelu_node_notes_its_approximate_attribute():
    [site] = sites(Fn(lambda x: F.gelu(x, approximate="tanh")))
    assert (site.nodes, site.input, site.output) == (("gelu",), "x", "gelu")
    assert site.note.startswith("approximate='tanh'")


def test_typo_note_names_the_constant():
    [site] = sites(Fn(lambda x: gelu_new(x, 0.0447)))
    assert "cubic coeff 0.0447" in site.note


def test_mixed_flavours_come_back_in_execution_order_with_module_paths():
    model = Model(torch.nn.GELU(), torch.nn.GELU(approximate="tanh"), Fn(lambda x: x * torch.sigmoid(1.702 * x)))
    found = sites(model)
    assert [(s.op, s.claimed) for s in found] == [
        ("aten.gelu", EXACT), ("aten.gelu", TANH), ("sigmoid-chain", QUICK)]
    assert [s.site_id.split(":")[0] for s in found] == ["0", "1", "2"]
    assert [s.note.split("in ")[-1] for s in found] == [
        "encoder.layers.0.mlp.act (GELU)", "encoder.layers.1.mlp.act (GELU)", "encoder.layers.2.mlp.act (Fn)"]


def test_finds_f_gelu_called_in_forward():
    found = sites(ConvStem(), torch.randn(1, 4, 16))
    assert [(s.op, s.claimed, s.nodes) for s in found] == [("aten.gelu", EXACT, ("gelu",)),
                                                         ("aten.gelu", EXACT, ("gelu_1",))]
    assert [s.input for s in found] == ["convolution", "convolution_1"]


@pytest.mark.parametrize(
    "act",
    [pytest.param(Fn(lambda x: x * torch.sigmoid(x)), id="silu-by-hand"), pytest.param(torch.nn.SiLU(), id="nn.SiLU"),
     pytest.param(torch.nn.ReLU(), id="nn.ReLU"), pytest.param(torch.nn.Tanh(), id="nn.Tanh")],
)
def test_models_without_gelu_have_no_sites(act):
    assert sites(Mlp(act)) == []


def test_constants_from_buffers_and_tensors_count():
    class BufferQuick(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("alpha", torch.tensor(1.702))

        def forward(self, x):
            return x * torch.sigmoid(self.alpha * x) + torch.tensor(0.5) * x * (1 - torch.erf(-x / math.sqrt(2)))

    assert [(s.op, s.claimed) for s in sites(BufferQuick())] == [("sigmoid-chain", QUICK), ("erf-chain", EXACT)]


def test_accepts_an_exported_program_and_kwargs():
    class Keyword(torch.nn.Module):
        def forward(self, *, hidden):
            return F.gelu(hidden, approximate="tanh")

    program = torch.export.export(Keyword(), (), {"hidden": torch.randn(2, 8)})
    [site] = find_torch_sites(program, ())
    assert (site.claimed, site.input) == (TANH, "hidden")
    assert find_torch_sites(Keyword(), (), {"hidden": torch.randn(2, 8)}) == [site]


def test_relu_helper_lists_relu_calls():
    class Relus(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = torch.nn.ReLU()

        def forward(self, x):
            return torch.relu(F.relu(self.act(F.gelu(x))))

    found = find_torch_relu_sites(Relus(), (torch.randn(2, 8),))
    assert [(s.site_id, s.op, s.claimed) for s in found] == [
        ("relu:0:relu", "aten.relu", RELU), ("relu:1:relu_1", "aten.relu", RELU), ("relu:2:relu_2", "aten.relu", RELU)]
    assert found[0].note == "in act (ReLU)"
    assert [s.claimed for s in find_torch_sites(Relus(), (torch.randn(2, 8),))] == [EXACT]


def test_in_place_arithmetic_is_read_as_torch_export_reads_it():
    class InPlaceQuick(torch.nn.Module):
        def forward(self, x):
            return x.clone().mul_(torch.sigmoid(x * 1.702))

    assert [(s.op, s.claimed) for s in sites(InPlaceQuick())] == [("sigmoid-chain", QUICK)]


def test_a_gelu_written_into_a_buffer_through_a_view_reaches_the_output():
    class IntoBuffer(torch.nn.Module):
        def forward(self, x):
            out = torch.zeros(2, 16)
            out[:, :8] = F.gelu(x)
            return out

    [site] = sites(IntoBuffer())
    assert site.used and site.claimed == EXACT


def test_a_gelu_whose_result_is_dropped_is_unused():
    class Dropped(torch.nn.Module):
        def forward(self, x):
            F.gelu(x)
            return x * 2

    [site] = sites(Dropped())
    assert not site.used
