"""What a user writes by hand, the optimum way, to export a transformers decoder folder with its KV
cache to ONNX and check it: load the causal LM from the folder, export it with torch.onnx at opset 17
(the TorchScript exporter, as optimum does) taking input_ids, attention_mask, position_ids and past_key_values.N.key/value and
returning logits and present.N.key/value, every length axis dynamic; then one greedy generate loop
in onnxruntime (a prefill and four cached decode steps), each step's logits held against
transformers' on the tokens the loop chose.

    python bench/handwritten/decoder_with_past.py FOLDER OUT.onnx
"""

import sys

import numpy as np
import onnxruntime as ort
import torch
from transformers import AutoModelForCausalLM, DynamicCache

folder, out = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(folder).eval()
config = model.config
layers = config.num_hidden_layers
heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
head_size = config.hidden_size // config.num_attention_heads


class WithPast(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        cache = DynamicCache(ddp_cache_data=list(zip(past[0::2], past[1::2])), config=config)
        result = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            past_key_values=cache, use_cache=True)
        presents = [t for layer in result.past_key_values.layers for t in (layer.keys, layer.values)]
        return (result.logits, *presents)


past_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
present_names = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
batch, sequence, past_length = 2, 3, 5
example = (torch.ones(batch, sequence, dtype=torch.long), torch.ones(batch, past_length + sequence, dtype=torch.long),
           torch.arange(past_length, past_length + sequence).expand(batch, -1),
           *[torch.rand(batch, heads, past_length, head_size) for _ in past_names])
axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "past_sequence_length + sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        **{name: {0: "batch_size", 2: "past_sequence_length"} for name in past_names},
        "logits": {0: "batch_size", 1: "sequence_length"},
        **{name: {0: "batch_size", 2: "past_sequence_length + sequence_length"} for name in present_names}}
with torch.no_grad():
    # eval(): the exporter restores the wrapper's mode afterwards, and a new module is in training
    # mode, which would leave the model's dropout on for the check below
    torch.onnx.export(WithPast().eval(), example, out, dynamo=False, opset_version=17, dynamic_axes=axes,
                      input_names=["input_ids", "attention_mask", "position_ids", *past_names],
                      output_names=["logits", *present_names])

# One greedy generate loop in onnxruntime, then transformers on the same tokens.
prompt = np.random.default_rng(0).integers(3, config.vocab_size, size=(batch, 6))
session = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
ids = prompt
past = {name: np.zeros((batch, heads, 0, head_size), np.float32) for name in past_names}
length, tokens, found = 0, [], []
for _ in range(5):
    mask = np.ones((batch, length + ids.shape[1]), np.int64)
    positions = np.arange(length, length + ids.shape[1], dtype=np.int64)[None].repeat(batch, 0)
    logits, *presents = session.run(None, {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **past})
    length += ids.shape[1]
    found.append(logits[:, -1])
    ids = logits[:, -1].argmax(-1)[:, None]
    tokens.append(ids[:, 0])
    past = dict(zip(past_names, presents))
tokens = np.stack(tokens, 1)
with torch.no_grad():
    sequence = torch.from_numpy(np.concatenate([prompt, tokens], axis=1))
    expected = model(input_ids=sequence).logits[:, prompt.shape[1] - 1:-1].numpy()
error = float(np.abs(np.stack(found, 1) - expected).max())
if error > 1e-4:
    sys.exit(f"logits differ from transformers' by {error:.3g} over the generated tokens {tokens.tolist()}")
print(f"generate OK: {tokens.tolist()}, logits within {error:.3g}")
