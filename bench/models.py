"""Models the benchmarks build in code (random weights, nothing downloaded)."""

BERT_SEQ = 128


def bert_base():
    """BERT-base from its transformers config: 110M parameters, one sequence of 128 tokens."""
    import torch
    import transformers as tr

    torch.manual_seed(0)
    config = tr.BertConfig()
    model = tr.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, BERT_SEQ))
    return model, {"input_ids": ids, "attention_mask": torch.ones(1, BERT_SEQ, dtype=torch.int64)}


def bert_tiny():
    """A tiny BERT from its transformers config (2 layers, hidden 64): two sequences of 16 tokens."""
    import torch
    import transformers as tr

    torch.manual_seed(0)
    config = tr.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=128)
    model = tr.BertModel(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 16))
    return model, {"input_ids": ids, "attention_mask": torch.ones(2, 16, dtype=torch.int64)}


def bert_tiny_seq128():
    """The tiny BERT of bert_tiny on BERT-sized inputs: eight sequences of 128 tokens."""
    import torch

    model, _ = bert_tiny()
    ids = torch.randint(0, 1000, (8, BERT_SEQ), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones(8, BERT_SEQ, dtype=torch.int64)}


def keras_bert_sized():
    """A BERT-base-sized Keras encoder (12 layers, hidden 768, 12 heads, GELU MLP of 3072),
    one sequence of 128 positions of float embeddings."""
    import numpy as np

    from exporter.frameworks.keras_framework import prepare_keras_environment

    prepare_keras_environment()
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input((BERT_SEQ, 768), batch_size=1, name="embeddings")
    x = inputs
    for _ in range(12):
        attended = keras.layers.MultiHeadAttention(num_heads=12, key_dim=64)(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + attended)
        hidden = keras.layers.Dense(3072, activation="gelu")(x)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + keras.layers.Dense(768)(hidden))
    model = keras.Model(inputs, x)
    return model, {"embeddings": np.random.default_rng(0).standard_normal((1, BERT_SEQ, 768)).astype("float32")}


def big_mlp():
    """A PyTorch MLP with about 2.6 GB of float32 weights (ten 8000x8000 layers, exact GELU
    between them): past protobuf's 2 GB limit, so the ONNX file keeps its weights outside."""
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(10):
        layers += [torch.nn.Linear(8000, 8000), torch.nn.GELU()]
    return torch.nn.Sequential(*layers[:-1]).eval(), (torch.randn(2, 8000),)


MOBILENET_SIZE = 224


def keras_mobilenet_v2():
    """keras.applications MobileNetV2 at alpha 0.35, 224x224, random weights (nothing downloaded),
    10 classes (a softmax over 1000 random-weight classes is about 0.001 each: all zero in int8)."""
    from exporter.frameworks.keras_framework import prepare_keras_environment

    prepare_keras_environment()
    import keras

    keras.utils.set_random_seed(0)
    return keras.applications.MobileNetV2(input_shape=(MOBILENET_SIZE, MOBILENET_SIZE, 3), alpha=0.35, weights=None,
                                          classes=10)


def save_big_llama_folder(path):
    """A Llama model folder with about 5.1 GB of float32 weights (hidden 2048, 26 layers, MLP 5632,
    32 query and 4 key/value heads, vocabulary 32000: 1.28 B parameters), seeded random weights,
    saved with safetensors; returns the weight bytes."""
    import torch
    import transformers as tr

    torch.manual_seed(0)
    config = tr.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=26, num_attention_heads=32,
                            num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048,
                            tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = tr.LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return sum(p.numel() * p.element_size() for p in model.parameters())


GATE_BATCH = 64


def _gate_mlp(hidden: int, gelu_repeats: int = 1):
    """Linear 128 -> `hidden`, exact GELU, Linear -> 128, on [64, 128]; the GELU written as its
    elementwise formula `gelu_repeats` times and averaged when more than one (the same values,
    that many times the elementwise work)."""
    import math

    import torch

    class GateMlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(128, hidden), torch.nn.Linear(hidden, 128)

        def forward(self, x):
            h = self.fc1(x)
            if gelu_repeats == 1:
                h = torch.nn.functional.gelu(h)
            else:
                h = sum(0.5 * (h + 0.01 * k) * (1 + torch.erf((h + 0.01 * k) / math.sqrt(2)))
                        for k in range(gelu_repeats)) / gelu_repeats
            return self.fc2(h)

    torch.manual_seed(0)
    return GateMlp().eval(), (torch.randn(GATE_BATCH, 128),)


def gate_mlp():
    """The release gate's baseline model (bench/measure_gate.py): hidden 512."""
    return _gate_mlp(512)


def gate_mlp_wide():
    """The same MLP with its hidden layer 4 times wider: a deliberate slow-down."""
    return _gate_mlp(2048)


def gate_mlp_gelu_x8():
    """The same MLP with its GELU written out as erf, Mul and Add 8 times: a deliberate slow-down."""
    return _gate_mlp(512, gelu_repeats=8)
