"""--data for a transformers model folder, through the folder's own processing, offline: text
(`.txt`: a sample a line; `.jsonl`: a JSON string, or an object with a "text" field, a line)
through its tokenizer, and a folder of images (.png, .jpg) through its image processor. Each
yields stacks of one batch of samples (exporter.feed_files.DataSet batches and checks them).

Text is padded as the folder's tokenizer pads (its `padding_side`), or on the side asked for (a
decoder's prompts for generation: on the left, as batched generation pads them): to the longest
line of the batch where the sequence axis is dynamic, to the export's length where it is not
(longer lines cut there, and counted). A tokenizer without a pad token (GPT-2's) pads with its
end-of-sequence token, as batched generation with it does; the padded positions are masked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import numpy as np

from exporter.sources import InputSpec
from verifiers.errors import BadInput, one_line

TEXT_SUFFIXES = (".txt", ".jsonl")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
OPTION = "--data"


def is_text(path: Path) -> bool:
    return path.suffix in TEXT_SUFFIXES and path.is_file()


def images_in(path: Path) -> list[Path]:
    """The images of a folder, in name order (none: not a folder of images)."""
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)


def text_stacks(path: Path, folder: Path, specs: list[InputSpec], batch: int, dynamic: set[tuple[str, int]],
                truncated: list[int], padding_side: str | None = None
                ) -> Iterator[tuple[dict[str, np.ndarray], str]]:
    """`batch` lines at a time through the folder's tokenizer, as the model's inputs, padded on
    `padding_side` (None: the tokenizer's own); the numbers of the lines cut to the export's length
    are appended to `truncated`."""
    tokenizer, _ = _padding_tokenizer(folder, path, padding_side)
    names = [spec.name for spec in specs]
    ids = next((spec for spec in specs if spec.name == "input_ids"), specs[0])
    length = None if (ids.name, 1) in dynamic or len(ids.shape) < 2 else ids.shape[1]
    lines = _lines(path)
    first = 0
    while chunk := list(islice(lines, batch)):
        texts = [text for _, text in chunk]
        try:
            encoded = tokenizer(texts, padding="longest" if length is None else "max_length", truncation=length is not None,
                                max_length=length, return_tensors="np")
            if length is not None:
                full = tokenizer(texts, padding=False, truncation=False)["input_ids"]
                truncated.extend(first + k for k, tokens in enumerate(full) if len(tokens) > length)
        except Exception as exc:  # noqa: BLE001 - the tokenizer's own error, on the user's text
            raise BadInput(f"{OPTION} {path}: line {chunk[0][0]} on: the tokenizer failed: {one_line(exc)}") from exc
        missing = [name for name in names if name not in encoded]
        if missing:
            raise BadInput(f"{OPTION} {path}: the tokenizer of {folder} gives {', '.join(encoded)}, not {missing[0]} "
                           f"(the model's inputs: {', '.join(names)}): give the inputs in an .npz")
        yield {name: np.asarray(encoded[name]) for name in names}, f"{path} lines {chunk[0][0]} to {chunk[-1][0]}"
        first += len(chunk)


def text_padding(folder: Path, path: Path, padding_side: str | None = None) -> dict[str, str]:
    """How text_stacks pads: the side and the pad token."""
    return _padding_tokenizer(folder, path, padding_side)[1]


def _padding_tokenizer(folder: Path, path: Path, padding_side: str | None):
    """The folder's tokenizer set to pad on `padding_side` (None: its own), with its end-of-sequence
    token as the pad token where it has none; and how it pads: {"side", "pad_token"}."""
    tokenizer = _processor("AutoTokenizer", folder, path, "tokenizer")
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    padding = {"side": tokenizer.padding_side}
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
        padding["pad_token"] = f"{tokenizer.eos_token} (the end-of-sequence token: the tokenizer has no pad token)"
    elif tokenizer.pad_token is not None:
        padding["pad_token"] = tokenizer.pad_token
    return tokenizer, padding


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, its text), blank lines skipped."""
    try:
        with open(path, encoding="utf-8") as text:
            for number, line in enumerate(text, 1):
                if not line.strip():
                    continue
                if path.suffix == ".txt":
                    yield number, line.rstrip("\n")
                    continue
                try:
                    value = json.loads(line)
                except ValueError as exc:
                    raise BadInput(f"{OPTION} {path}: line {number} is not JSON: {one_line(exc)}") from exc
                text_value = value.get("text") if isinstance(value, dict) else value
                if not isinstance(text_value, str):
                    raise BadInput(f"{OPTION} {path}: line {number}: expected a JSON string or an object with a "
                                   f'"text" string')
                yield number, text_value
    except UnicodeDecodeError as exc:
        raise BadInput(f"{OPTION} {path}: not UTF-8 text: {one_line(exc)}") from exc


def image_stacks(images: list[Path], folder: Path, specs: list[InputSpec], batch: int
                 ) -> Iterator[tuple[dict[str, np.ndarray], str]]:
    """`batch` images at a time through the folder's image processor, as its pixel_values."""
    from PIL import Image

    processor = _processor("AutoImageProcessor", folder, images[0].parent, "image processor")
    names = [spec.name for spec in specs]
    if names != ["pixel_values"]:
        raise BadInput(f"{OPTION} {images[0].parent}: images feed pixel_values; the model takes {', '.join(names)}: "
                       "give the inputs in an .npz")
    for start in range(0, len(images), batch):
        chunk = images[start:start + batch]
        pictures = []
        for path in chunk:
            try:
                with Image.open(path) as image:
                    pictures.append(image.convert("RGB"))
            except Exception as exc:  # noqa: BLE001 - PIL's error, on the user's file
                raise BadInput(f"{OPTION} {path}: unreadable image: {one_line(exc)}") from exc
        pixels = processor(images=pictures, return_tensors="np")["pixel_values"]
        yield {"pixel_values": np.asarray(pixels)}, f"{chunk[0]} to {chunk[-1].name}"


def _processor(kind: str, folder: Path, data: Path, what: str):
    """The folder's tokenizer or image processor, from its own files (nothing downloaded)."""
    import transformers

    try:
        return getattr(transformers, kind).from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - transformers says what is missing
        raise BadInput(f"{OPTION} {data}: goes through the {what} of {folder}, which does not load: "
                       f"{one_line(exc)}") from exc
