"""The tasks a transformers model folder is exported for, as data: which transformers head class does
the task (the mapping of model types to classes transformers keeps for it), what the exported model
takes and returns, and which axes stay dynamic. Names follow optimum's (`feature-extraction`,
`text-generation`, ...), as do the symbolic axes (`batch_size`, `sequence_length`).

What a task feeds depends on the model's modality, read from its `main_input_name`: token ids for a
text model, pixels for a vision model. An input the model's forward does not take is left out (a
DistilBERT takes no token_type_ids).

A task `with past` runs a decoder one step of generation with its KV cache, in the layout
onnxruntime-genai and optimum's runtime read: `past_key_values.N.key` / `.value` in (batch_size,
heads, past_sequence_length, head_size), `present.N.key` / `.value` out, past and new positions
together; the attention mask covers both (`past_sequence_length + sequence_length`).

An encoder-decoder generates with two artifacts, in the layout of optimum's decoder with past and
onnxruntime's encoder-decoder exports: the encoder (`text2text-generation-encoder`, Whisper's
`automatic-speech-recognition-encoder`) runs once per prompt and returns, beside its hidden
states, every decoder layer's cross-attention key and value (`present.N.encoder.key` / `.value`:
they depend on the encoder's output only); the decoder (`text2text-generation-with-past`,
`automatic-speech-recognition-with-past`) runs every step with its own cache
(`past_key_values.N.decoder.key` / `.value` in, `present.N.decoder.*` out) and the encoder's
(`past_key_values.N.encoder.*`, the same at every step). Neither is inferred from the folder: a
part is exported when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

# The cache's names in that layout: PAST + "N.key" in, PRESENT + "N.key" out (the same for .value).
PAST, PRESENT = "past_key_values.", "present."


@dataclass(frozen=True)
class TaskInput:
    name: str
    dtype: str
    axes: tuple[str, ...]  # one symbol per axis
    values: str  # how an example is drawn: "tokens", "mask", "zeros", "normal", "positions"
    argument: str = ""  # the model's keyword for it, when that is not its name

    @property
    def keyword(self) -> str:
        return self.argument or self.name


@dataclass(frozen=True)
class Task:
    name: str
    mapping: str  # transformers.models.auto.modeling_auto's <NAME>_MAPPING_NAMES: model type -> class name
    outputs: tuple[str, ...]  # the head's outputs the artifact returns, by name
    # inputs by the model's main input ("input_ids", "pixel_values")
    inputs: dict[str, tuple[TaskInput, ...]]
    dynamic: tuple[str, ...] = ("batch_size", "sequence_length")  # symbols exported dynamic
    causal: bool = False  # a decoder: called without a cache, unless with past
    # how the model is called (exporter.model_folders.CALLS): "head" on the inputs; "cached" a decoder with its
    # cache; an encoder-decoder's "encoder" with the cross-attention cache, or its "cached-decoder"
    call: str = "head"

    @property
    def past(self) -> bool:
        """past_key_values in, present out (see the module docstring)."""
        return self.call in ("cached", "cached-decoder")

    @property
    def part(self) -> bool:
        """One of an encoder-decoder's two artifacts: exported when asked for, never inferred."""
        return self.call in ("encoder", "cached-decoder")


TEXT = (
    TaskInput("input_ids", "int64", ("batch_size", "sequence_length"), "tokens"),
    TaskInput("attention_mask", "int64", ("batch_size", "sequence_length"), "mask"),
    TaskInput("token_type_ids", "int64", ("batch_size", "sequence_length"), "zeros"),
)
CHOICES = tuple(TaskInput(i.name, i.dtype, ("batch_size", "num_choices", "sequence_length"), i.values) for i in TEXT)
PIXELS = (TaskInput("pixel_values", "float32", ("batch_size", "num_channels", "height", "width"), "normal"),)
# log-mel features of a fixed number of frames (Whisper pads every input to 30 s)
FEATURES = (
    TaskInput("input_features", "float32", ("batch_size", "feature_size", "encoder_sequence_length"), "normal"),
    TaskInput("decoder_input_ids", "int64", ("batch_size", "decoder_sequence_length"), "tokens"),
)
PAST_MASK = "past_sequence_length + sequence_length"
CACHED = (
    TEXT[0],
    TaskInput("attention_mask", "int64", ("batch_size", PAST_MASK), "mask"),
    TaskInput("position_ids", "int64", ("batch_size", "sequence_length"), "positions"),
)
SEQ2SEQ = (
    *TEXT[:2],
    TaskInput("decoder_input_ids", "int64", ("batch_size", "decoder_sequence_length"), "tokens"),
)
# An encoder-decoder's encoder, by its main input: token ids and their padding, or Whisper's features
ENCODERS = {"input_ids": tuple(TaskInput(i.name, i.dtype, ("batch_size", "encoder_sequence_length"), i.values)
                               for i in TEXT[:2]),
            "input_features": FEATURES[:1]}
DECODER_TOKENS = TaskInput("input_ids", "int64", ("batch_size", "decoder_sequence_length"), "tokens",
                           "decoder_input_ids")
# the decoder's tokens and the encoder's padding (Whisper's encoder has none); the caches follow from
# the model (model_folders)
DECODERS_WITH_PAST = {
    "input_ids": (DECODER_TOKENS, TaskInput("encoder_attention_mask", "int64", ("batch_size", "encoder_sequence_length"),
                                            "mask", "attention_mask")),
    "input_features": (DECODER_TOKENS,),
}

TASKS: dict[str, Task] = {task.name: task for task in (
    Task("feature-extraction", "MODEL_MAPPING_NAMES", ("last_hidden_state",),
         {"input_ids": TEXT, "pixel_values": PIXELS}),
    Task("fill-mask", "MODEL_FOR_MASKED_LM_MAPPING_NAMES", ("logits",), {"input_ids": TEXT}),
    Task("text-classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", ("logits",), {"input_ids": TEXT}),
    Task("token-classification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", ("logits",), {"input_ids": TEXT}),
    Task("question-answering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", ("start_logits", "end_logits"),
         {"input_ids": TEXT}),
    Task("multiple-choice", "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES", ("logits",), {"input_ids": CHOICES},
         dynamic=("batch_size", "num_choices", "sequence_length")),
    Task("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", ("logits",),
         {"pixel_values": PIXELS}, dynamic=("batch_size",)),
    Task("semantic-segmentation", "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES", ("logits",),
         {"pixel_values": PIXELS}, dynamic=("batch_size",)),
    Task("object-detection", "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES", ("logits", "pred_boxes"),
         {"pixel_values": PIXELS}, dynamic=("batch_size",)),
    Task("text-generation", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", ("logits",), {"input_ids": TEXT[:2]},
         causal=True),
    Task("text-generation-with-past", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", ("logits",), {"input_ids": CACHED},
         dynamic=("batch_size", "sequence_length", "past_sequence_length", PAST_MASK), causal=True, call="cached"),
    Task("automatic-speech-recognition", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", ("logits",),
         {"input_features": FEATURES}, dynamic=("batch_size", "decoder_sequence_length"), causal=True),
    Task("text2text-generation", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", ("logits",),
         {"input_ids": SEQ2SEQ}, dynamic=("batch_size", "sequence_length", "decoder_sequence_length"), causal=True),
    Task("text2text-generation-encoder", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", ("last_hidden_state",),
         ENCODERS, dynamic=("batch_size", "encoder_sequence_length"), call="encoder"),
    Task("text2text-generation-with-past", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", ("logits",),
         DECODERS_WITH_PAST,
         dynamic=("batch_size", "decoder_sequence_length", "past_decoder_sequence_length", "encoder_sequence_length"),
         causal=True, call="cached-decoder"),
    # Whisper pads every input to 30 s: its encoder takes a fixed number of frames
    Task("automatic-speech-recognition-encoder", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", ("last_hidden_state",),
         ENCODERS, dynamic=("batch_size",), call="encoder"),
    Task("automatic-speech-recognition-with-past", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", ("logits",),
         DECODERS_WITH_PAST,
         dynamic=("batch_size", "decoder_sequence_length", "past_decoder_sequence_length", "encoder_sequence_length"),
         causal=True, call="cached-decoder"),
)}
