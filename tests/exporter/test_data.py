"""--data: the artifact judged against its source on the user's own samples, streamed in batches,
with statistics per sample and the worst sample localised. The oracles run the source and the
artifact by hand (torch, onnxruntime) or hash the data file themselves."""

import hashlib
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from exporter import api
from fixtures.children import REPO
from fixtures.specs import MODELS

PIXELS = f"{MODELS / 'data_models.py'}:pixel_classifier"
MLP = f"{REPO / 'examples/mlp.py'}:build"  # input [8, 16] float32


def clipped_at_8(path, out):
    """The artifact with its input clipped at 8 before anything else reads it: wrong only where
    an input exceeds 8 (pixels do; random normals times 2 almost never)."""
    model = onnx.load(str(path))
    graph = model.graph
    name = graph.input[0].name
    for node in graph.node:
        node.input[:] = [f"{name}_clipped" if i == name else i for i in node.input]
    graph.initializer.extend([helper.make_tensor("clip_low", TensorProto.FLOAT, [], [-3.0e38]),
                              helper.make_tensor("clip_high", TensorProto.FLOAT, [], [8.0])])
    graph.node.insert(0, helper.make_node("Clip", [name, "clip_low", "clip_high"], [f"{name}_clipped"],
                                          name="input_clip"))
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="module")
def pixel_artifacts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pixels")
    report = api.export(PIXELS, to="onnx", opset=17, out=folder / "faithful.onnx")
    assert report.exit_code == 0, report.summary_lines()
    images = np.random.default_rng(0).integers(0, 256, (6, 3, 16, 16)).astype(np.float32)
    np.savez(folder / "images.npz", pixels=images)
    return folder / "faithful.onnx", clipped_at_8(folder / "faithful.onnx", folder / "clipped.onnx"), \
        folder / "images.npz", images


def by_hand_outputs(artifact, images) -> tuple[np.ndarray, np.ndarray]:
    """The source's outputs (torch) and the artifact's (onnxruntime) on the images, two at a time,
    one row per image."""
    import onnxruntime
    import torch

    from fixtures.models.data_models import pixel_classifier

    model, _ = pixel_classifier()
    session = onnxruntime.InferenceSession(str(artifact), providers=["CPUExecutionProvider"])
    expected, found = [], []
    for start in range(0, len(images), 2):
        batch = images[start:start + 2]
        with torch.no_grad():
            expected.append(model(torch.from_numpy(batch)).numpy().reshape(len(batch), -1))
        found.append(session.run(None, {session.get_inputs()[0].name: batch})[0].reshape(len(batch), -1))
    return np.concatenate(expected).astype(np.float64), np.concatenate(found).astype(np.float64)


def by_hand_max_abs_per_sample(artifact, images) -> np.ndarray:
    """Each image's max abs error."""
    expected, found = by_hand_outputs(artifact, images)
    return np.abs(found - expected).max(axis=1)


def test_an_artifact_wrong_only_on_real_inputs_passes_on_random_ones_and_fails_on_the_data(pixel_artifacts):
    _, clipped, images_file, images = pixel_artifacts

    assert api.verify(clipped, source=PIXELS).exit_code == 0  # random normals never reach 8

    report = api.verify(clipped, source=PIXELS, data=str(images_file))

    assert report.exit_code == 1, report.summary_lines()
    [finding] = [f for f in report.failures if f.data.get("data")]
    errors = by_hand_max_abs_per_sample(clipped, images)
    worst = int(np.argmax(errors))
    assert finding.data["sample"] == worst and f"worst sample {worst}:" in finding.message, (finding, errors)
    assert finding.data["max_abs_err"] == pytest.approx(errors[worst], rel=1e-4)
    [stats] = report.data["outputs"]
    assert stats["samples"] == 6 and stats["samples_out_of_tolerance"] == int(np.sum(errors > 1e-4 + 1e-3))
    assert stats["max_abs"]["worst_sample"] == worst
    assert report.divergence["first"]["node"] == "input_clip", report.divergence  # the op that clips
    assert f"sample {worst}" in report.divergence["batch"]


def test_a_faithful_artifact_passes_on_the_data_and_the_report_says_what_was_fed(pixel_artifacts):
    faithful, _, images_file, images = pixel_artifacts

    report = api.verify(faithful, source=PIXELS, data=str(images_file))

    assert report.exit_code == 0, report.summary_lines()
    data = report.data
    assert data["files"] == [{"path": str(images_file), "sha256": hashlib.sha256(images_file.read_bytes()).hexdigest()}]
    assert (data["samples"], data["batches"], data["batch_size"], data["filled"]) == (6, 3, 2, 0)
    assert data["inputs"]["pixels"] == {"min": float(images.min()), "max": float(images.max())}
    [stats] = data["outputs"]
    errors = by_hand_max_abs_per_sample(faithful, images)
    assert stats["max_abs"]["worst"] == pytest.approx(errors.max(), rel=1e-3, abs=1e-9)
    assert stats["top1"]["mean"] == 1.0  # ten classes: the same winner on every sample
    assert report.batches == 0 and report.feeds[0]["origin"] == "the source's example inputs"


def test_floors_on_cosine_and_sqnr_fail_a_float_artifact_naming_the_worst_sample(pixel_artifacts):
    """Tolerances loose enough to pass the clipped artifact: the floors alone catch it."""
    faithful, clipped, images_file, images = pixel_artifacts
    expected, found = by_hand_outputs(clipped, images)
    cosine = (expected * found).sum(1) / np.sqrt((expected ** 2).sum(1) * (found ** 2).sum(1))
    sqnr = 10 * np.log10((expected ** 2).sum(1) / ((expected - found) ** 2).sum(1))
    floors = dict(min_cosine=float(np.median(cosine)), min_sqnr=float(np.median(sqnr)))

    assert api.verify(faithful, source=PIXELS, data=str(images_file), **floors).exit_code == 0
    report = api.verify(clipped, source=PIXELS, data=str(images_file), atol=["1e9"], **floors)

    assert report.exit_code == 1, report.summary_lines()
    by_statistic = {f.data["statistic"]: f for f in report.failures}
    assert set(by_statistic) == {"cosine", "sqnr_db"}  # max abs within the tolerance given
    worst = int(np.argmin(cosine))
    assert by_statistic["cosine"].data["sample"] == worst and f"sample {worst} " in by_statistic["cosine"].message
    assert by_statistic["cosine"].data["cosine"] == pytest.approx(cosine[worst], abs=1e-6)
    worst = int(np.argmin(sqnr))
    assert by_statistic["sqnr_db"].data["sample"] == worst
    assert by_statistic["sqnr_db"].data["sqnr_db"] == pytest.approx(sqnr[worst], abs=1e-3)
    assert report.divergence["first"]["node"] == "input_clip", report.divergence  # localised on the worst sample


def test_a_top1_floor_fails_an_artifact_whose_winning_class_changes_on_some_samples(pixel_artifacts, tmp_path):
    """The classifier's bias of the class every image picks lowered by the median margin over the
    runner-up: about half the images pick another class."""
    faithful, _, images_file, images = pixel_artifacts
    expected, _ = by_hand_outputs(faithful, images)
    winner = np.bincount(expected.argmax(1)).argmax()
    margins = expected[:, winner] - np.sort(expected, axis=1)[:, -2]
    model = onnx.load(str(faithful))
    [bias] = [t for t in model.graph.initializer if list(t.dims) == [10]]
    values = onnx.numpy_helper.to_array(bias).copy()
    values[winner] -= float(np.median(margins))
    bias.CopyFrom(onnx.numpy_helper.from_array(values, bias.name))
    onnx.save(model, str(tmp_path / "shifted.onnx"))
    _, found = by_hand_outputs(tmp_path / "shifted.onnx", images)
    agree = expected.argmax(1) == found.argmax(1)
    assert 0 < agree.mean() < 1, agree

    report = api.verify(tmp_path / "shifted.onnx", source=PIXELS, data=str(images_file), atol=["1e9"], min_top1=0.99)

    assert report.exit_code == 1, report.summary_lines()
    [finding] = report.failures
    assert finding.data["statistic"] == "top1" and finding.data["top1"] == pytest.approx(agree.mean())
    assert finding.data["sample"] == int(np.flatnonzero(~agree)[0])  # the first image whose class changed


def test_floors_without_data_on_a_float_artifact_are_said_not_applied(pixel_artifacts):
    faithful, _, _, _ = pixel_artifacts

    report = api.verify(faithful, source=PIXELS, min_cosine=0.5, min_top1=0.5)

    assert report.exit_code == 0
    assert any(note.startswith("--min-cosine, --min-top1: not applied") and note.endswith("give --data to apply them")
               for note in report.notes), report.notes


def test_samples_that_do_not_fill_the_last_batch_are_repeated_and_not_counted(tmp_path):
    samples = np.random.default_rng(1).uniform(0, 1, (9, 16)).astype(np.float32)
    np.savez(tmp_path / "nine.npz", input=samples)

    report = api.export(MLP, to="onnx", opset=17, out=tmp_path / "m.onnx", data=str(tmp_path / "nine.npz"))

    assert report.exit_code == 0, report.summary_lines()
    assert (report.data["samples"], report.data["batches"], report.data["filled"]) == (9, 2, 7)
    assert report.data["outputs"][0]["samples"] == 9
    assert report.data["outputs"][0]["max_abs"]["worst_sample"] in range(9)
    assert any("7 repeated to fill" in note for note in report.notes)


@pytest.mark.slow  # a keras.applications model: the slow suite's (the PyTorch CNN's images run by default)
def test_a_keras_applications_model_is_verified_on_an_npz_of_images(tmp_path):
    images = np.random.default_rng(2).uniform(0, 255, (3, 96, 96, 3)).astype(np.float32)
    np.savez(tmp_path / "images.npz", image=images)

    report = api.export(f"{MODELS / 'int8_models.py'}:keras_mobilenet_v2", to="onnx", opset=17,
                        out=tmp_path / "mnv2.onnx", data=str(tmp_path / "images.npz"))

    assert report.exit_code == 0, report.summary_lines()
    assert report.data["samples"] == 3
    [stats] = report.data["outputs"]
    assert stats["samples_out_of_tolerance"] == 0 and stats["cosine"]["worst"] > 0.9999


def _npz(folder, **arrays):
    path = folder / "data.npz"
    np.savez(path, **arrays)
    return str(path)


def _folder(folder, **arrays):
    data = folder / "data"
    data.mkdir()
    for name, array in arrays.items():
        np.save(data / f"{name}.npy", array, allow_pickle=True)
    return str(data)


BAD_DATA = {
    "missing input": (lambda d: _npz(d, other=np.zeros((2, 16), np.float32)), "unknown input 'other'"),
    "no input at all": (lambda d: _npz(d), "input 'input' is missing"),
    "float64": (lambda d: _npz(d, input=np.zeros((2, 16))), "give --data-cast"),
    "wrong rank": (lambda d: _npz(d, input=np.zeros((2, 4, 4), np.float32)), "expected float32 of shape Nx16"),
    "wrong kind": (lambda d: _npz(d, input=np.zeros((2, 16), np.int64)), "found int64"),
    "no samples": (lambda d: _npz(d, input=np.zeros((0, 16), np.float32)), "no samples in it"),
    "objects": (lambda d: _folder(d, input=np.array([{}, 1], dtype=object)), "never unpickles"),
    "mixed folder": (lambda d: (_folder(d, input=np.zeros((2, 16), np.float32)), np.savez(d / "data/b.npz"))[0],
                     "a folder of one kind of file"),
    "no such file": (lambda d: str(d / "absent.npz"), "no such file or folder"),
}


@pytest.mark.parametrize("case", BAD_DATA)
def test_bad_data_is_exit_2_naming_the_file_and_what_is_wrong(shared_artifact, tmp_path, case):
    make, expected = BAD_DATA[case]
    artifact = shared_artifact(tmp_path, MLP, "mlp.onnx", to="onnx", opset=17)
    data = make(tmp_path)

    report = api.verify(artifact, source=MLP, data=data)

    assert report.exit_code == 2, report.summary_lines()
    [failure] = report.failures
    assert failure.message.startswith(f"--data {data}") and expected in failure.message, failure.message
    assert not report.verified and not report.data.get("outputs")


def test_data_cast_casts_within_the_kind(shared_artifact, tmp_path):
    artifact = shared_artifact(tmp_path, MLP, "mlp.onnx", to="onnx", opset=17)
    data = _npz(tmp_path, input=np.random.default_rng(3).standard_normal((4, 16)))

    report = api.verify(artifact, source=MLP, data=data, data_cast=True)

    assert report.exit_code == 0, report.summary_lines()
    assert report.data["samples"] == 4


def test_the_cli_takes_data_and_prints_the_worst_sample(shared_artifact, tmp_path, cli):
    artifact = shared_artifact(tmp_path, MLP, "mlp.onnx", to="onnx", opset=17)
    data = _npz(tmp_path, input=np.random.default_rng(4).standard_normal((16, 16)).astype(np.float32))

    result = cli("verify", artifact, "--source", MLP, "--data", data)

    assert result.returncode == 0, result.stderr
    assert f"on {data}: 16 sample(s) in 2 batch(es), every output within tolerance" in result.stdout + result.stderr


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    """transformers' BertForSequenceClassification saved with a WordPiece tokenizer of its vocabulary."""
    from transformers import BertTokenizerFast

    from fixtures.models.hf_folders import save_folder

    root = tmp_path_factory.mktemp("bert")
    folder = save_folder("bert-text-classification", root / "bert")
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(95))]))
    BertTokenizerFast(str(vocab)).save_pretrained(str(folder))
    return folder


SENTENCES = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10 w11", "w12 w13", "w14 w15 w16 w17"]


def test_a_bert_folder_is_verified_on_sentences_through_its_tokenizer(bert_folder, tmp_path):
    from transformers import AutoTokenizer

    lines = [json.dumps(SENTENCES[0]), json.dumps({"text": SENTENCES[1], "label": 0}), "",
             *(json.dumps({"text": s}) for s in SENTENCES[2:])]
    (tmp_path / "sentences.jsonl").write_text("\n".join(lines) + "\n")

    report = api.export(str(bert_folder), to="onnx", opset=17, out=tmp_path / "bert.onnx",
                        data=str(tmp_path / "sentences.jsonl"))  # a folder's sequence axis is dynamic

    assert report.exit_code == 0, report.summary_lines()
    assert report.data["samples"] == len(SENTENCES)
    # Each batch padded to its longest sentence, as the tokenizer pads: the lengths the data has.
    tokenizer = AutoTokenizer.from_pretrained(str(bert_folder))
    batch = report.data["batch_size"]
    lengths = {max(len(tokenizer(s)["input_ids"]) for s in SENTENCES[k:k + batch])
               for k in range(0, len(SENTENCES), batch)}
    assert {shape["input_ids"][1] for shape in report.data["shapes"]} == lengths
    [stats] = report.data["outputs"]
    assert stats["samples"] == len(SENTENCES) and stats["samples_out_of_tolerance"] == 0


@pytest.mark.slow  # a TFLite export of BERT: the slow suite's (the tokenizer's text runs by default on ONNX)
def test_text_longer_than_a_static_export_is_cut_and_counted(bert_folder, tmp_path):
    from transformers import AutoTokenizer

    sentences = [*SENTENCES, " ".join(f"w{i}" for i in range(40))]
    (tmp_path / "sentences.txt").write_text("\n".join(sentences) + "\n")

    report = api.export(str(bert_folder), to="tflite", out=tmp_path / "bert.tflite",  # static shapes only
                        data=str(tmp_path / "sentences.txt"))

    assert report.exit_code == 0, report.summary_lines()
    [shape] = report.data["shapes"]
    length = shape["input_ids"][1]
    tokenizer = AutoTokenizer.from_pretrained(str(bert_folder))
    longer = [k for k, sentence in enumerate(sentences) if len(tokenizer(sentence)["input_ids"]) > length]
    assert len(sentences) - 1 in longer and report.data["truncated"] == longer


def test_text_for_a_model_that_is_no_folder_is_exit_2(shared_artifact, tmp_path):
    artifact = shared_artifact(tmp_path, MLP, "mlp.onnx", to="onnx", opset=17)
    (tmp_path / "text.txt").write_text("a sentence\n")

    report = api.verify(artifact, source=MLP, data=str(tmp_path / "text.txt"))

    assert report.exit_code == 2 and "tokenizer or image processor" in report.failures[0].message


def test_a_vit_folder_is_verified_on_png_images_through_its_image_processor(tmp_path):
    from PIL import Image
    from transformers import AutoImageProcessor, ViTImageProcessor

    from fixtures.models.hf_folders import save_folder

    folder = save_folder("vit-image-classification", tmp_path / "vit")
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(str(folder))
    images = tmp_path / "images"
    images.mkdir()
    rng = np.random.default_rng(5)
    for k, size in enumerate([(40, 48), (32, 32), (64, 20)]):
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(images / f"{k}.png")
    (images / "notes.txt").write_text("not an image: left out")

    report = api.export(str(folder), to="onnx", opset=17, out=tmp_path / "vit.onnx", data=str(images))

    assert report.exit_code == 0, report.summary_lines()
    assert report.data["samples"] == 3 and [f["path"] for f in report.data["files"]] == \
        [str(images / f"{k}.png") for k in range(3)]
    processor = AutoImageProcessor.from_pretrained(str(folder))
    pixels = processor(images=[Image.open(images / f"{k}.png").convert("RGB") for k in range(3)],
                       return_tensors="np")["pixel_values"]
    assert report.data["inputs"]["pixel_values"] == pytest.approx({"min": float(pixels.min()),
                                                                   "max": float(pixels.max())})


def test_an_unreadable_image_is_exit_2_naming_it(tmp_path):
    from transformers import ViTImageProcessor

    from fixtures.models.hf_folders import save_folder

    folder = save_folder("vit-image-classification", tmp_path / "vit")
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(str(folder))
    images = tmp_path / "images"
    images.mkdir()
    (images / "0.png").write_bytes(b"not a png")

    report = api.export(str(folder), to="onnx", opset=17, out=tmp_path / "vit.onnx", data=str(images))

    assert report.exit_code == 2
    assert report.failures[0].message.startswith(f"--data {images / '0.png'}: unreadable image")


def test_an_int8_export_on_data_calibrates_on_some_samples_and_is_verified_on_the_others(tmp_path):
    rng = np.random.default_rng(6)
    np.savez(tmp_path / "data.npz", input=rng.uniform(0, 1, (64, 16)).astype(np.float32))

    report = api.export(MLP, to="onnx", opset=17, quantize="int8", out=tmp_path / "int8.onnx",
                        data=str(tmp_path / "data.npz"))

    assert report.exit_code == 0, report.summary_lines()
    assert report.quantization["calibration"]["samples"] == 32 and "even-numbered" in \
        report.quantization["calibration"]["source"]
    assert report.data["samples"] == 32 and report.data["verified_on"] == "the odd-numbered samples"
    [stats] = report.data["outputs"]
    assert stats["sqnr_db_all_samples"] >= 20
    # The example inputs (random normals) lie outside the calibrated range: noted, not judged.
    assert any("judged on --data alone" in note for note in report.notes)


def test_int8_data_beyond_the_calibrated_range_is_named_as_such(tmp_path):
    rng = np.random.default_rng(7)
    np.savez(tmp_path / "calibration.npz", input=rng.uniform(0, 1, (32, 16)).astype(np.float32))
    np.savez(tmp_path / "like_it.npz", input=rng.uniform(0, 1, (16, 16)).astype(np.float32))
    exported = api.export(MLP, to="onnx", opset=17, quantize="int8", out=tmp_path / "int8.onnx",
                          calibration=str(tmp_path / "calibration.npz"), data=str(tmp_path / "like_it.npz"))
    assert exported.exit_code == 0, exported.summary_lines()
    # Samples 0 to 2 like the calibration data, the rest reaching five times as far.
    other = np.concatenate([rng.uniform(0, 1, (3, 16)), rng.uniform(0, 5, (13, 16))]).astype(np.float32)
    np.savez(tmp_path / "other.npz", input=other)

    report = api.verify(tmp_path / "int8.onnx", source=MLP, data=str(tmp_path / "other.npz"))

    assert report.exit_code == 1, report.summary_lines()
    [entry] = report.data["outside_calibration"]
    assert (entry["input"], entry["first_sample"], entry["samples"]) == ("input", 3, 13)
    assert entry["range"][1] == pytest.approx(1.0, abs=0.05)  # what the calibration data reached
    [finding] = [f for f in report.failures if f.data.get("data")]
    assert "SQNR" in finding.message and "13 sample(s) lie outside the calibration range" in finding.message
    # The layers compared with the float model's on the batch holding the worst sample.
    # (the first to fall below the floor: the input, clamped to its calibrated range)
    assert finding.data["first_collapse"]["tensor"] == "input", report.quantization


@pytest.mark.slow  # BERT's whole vocabulary: the slow suite's (the clipped input is caught by default)
def test_an_embedding_row_wrong_only_for_tokens_the_data_uses_fails_only_on_the_data(tmp_path):
    """BERT with a 30,522-token vocabulary (BERT's): three rows of the artifact's word embeddings
    changed, rows the seeded random ids (a few hundred of 30,522) all but never reach and the
    data's sentences use."""
    import onnx.numpy_helper
    from transformers import AutoTokenizer, BertTokenizerFast

    from fixtures.models.hf_folders import FOLDERS, FolderSpec, save_folder

    spec = FOLDERS["bert-text-classification"]
    folder = save_folder(FolderSpec(spec.model_type, spec.head, spec.task, {**spec.config, "vocab_size": 30522}),
                         tmp_path / "bert")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(30517))]))
    BertTokenizerFast(str(vocab)).save_pretrained(str(folder))
    assert api.export(str(folder), to="onnx", opset=17, out=tmp_path / "bert.onnx").exit_code == 0
    changed = AutoTokenizer.from_pretrained(str(folder))("w17001 w23002 w29003", add_special_tokens=False)["input_ids"]
    model = onnx.load(str(tmp_path / "bert.onnx"))
    [table] = [t for t in model.graph.initializer if list(t.dims)[:1] == [30522]]
    weights = onnx.numpy_helper.to_array(table).copy()
    weights[changed] += np.random.default_rng(8).normal(0, 2.0, weights[changed].shape)  # (LayerNorm would undo a shift)
    table.CopyFrom(onnx.numpy_helper.from_array(weights, table.name))
    onnx.save(model, str(tmp_path / "changed.onnx"))
    (tmp_path / "sentences.txt").write_text("w1 w2 w3\nw17001 w5 w23002\nw6 w7\nw29003 w8\n")

    assert api.verify(tmp_path / "changed.onnx", source=str(folder)).exit_code == 0

    report = api.verify(tmp_path / "changed.onnx", source=str(folder), data=str(tmp_path / "sentences.txt"))

    assert report.exit_code == 1, report.summary_lines()
    [stats] = report.data["outputs"]
    # Only sentences 1 and 3 hold a changed token; the others run as the source does.
    assert stats["failing_samples"] and set(stats["failing_samples"]) <= {1, 3}, stats
    assert stats["max_abs"]["worst_sample"] in stats["failing_samples"]
    assert report.divergence["first"]["op_type"] == "Gather", report.divergence  # the embedding lookup


def test_the_html_report_plots_the_error_sample_by_sample(pixel_artifacts, tmp_path):
    _, clipped, images_file, images = pixel_artifacts

    report = api.verify(clipped, source=PIXELS, data=str(images_file), reports={"html": tmp_path / "r.html"})

    page = (tmp_path / "r.html").read_text()
    assert "<h3>On the data</h3>" in page and "max |artifact - source| by sample" in page
    series = report.data["outputs"][0]["max_abs_by_sample"]
    assert series["samples_per_point"] == 1
    assert series["points"] == pytest.approx(list(by_hand_max_abs_per_sample(clipped, images)), rel=1e-4)


def test_a_long_series_is_kept_to_its_points_each_the_worst_of_its_samples():
    from verifiers.sample_statistics import SERIES_POINTS, Series

    values = np.random.default_rng(9).uniform(0, 1, 5 * SERIES_POINTS + 7)
    series = Series()
    for value in values:
        series.add(float(value))

    record = series.record()
    per = record["samples_per_point"]
    assert len(record["points"]) <= SERIES_POINTS
    assert record["points"] == [values[k:k + per].max() for k in range(0, len(values), per)]


def test_per_sample_statistics_are_each_samples_own():
    """Row by row at once, as the metrics of verifiers.quantization compute them one sample at a
    time; identical, all-zero and NaN rows included; the filling rows of a batch not counted."""
    from verifiers.compare import Tolerance
    from verifiers.quantization.metrics import cosine, sqnr_db
    from verifiers.sample_statistics import OutputStatistics

    rng = np.random.default_rng(10)
    ref = rng.standard_normal((6, 3, 7)).astype(np.float32)
    art = (ref + rng.normal(0, 1e-2, ref.shape)).astype(np.float32)
    art[1] = ref[1]  # identical
    ref[2] = art[2] = 0.0  # all zeros on both sides
    art[3, 0, 0] = np.nan  # NaN where the source has a number
    stats = OutputStatistics("logits", None, Tolerance(1e-3, 0.0))
    stats.add(ref, art, [10, 11, 12, 13, 14])  # the sixth row fills the batch

    rows = range(5)
    max_abs = [np.inf if r == 3 else float(np.abs(art[r].astype(np.float64) - ref[r]).max()) for r in rows]
    assert stats.samples == 5 and stats.by_sample.points == pytest.approx(max_abs)
    assert stats.failing == [10, 13, 14] and stats.failing_samples == 3
    sqnr = [sqnr_db([ref[r].astype(np.float64)], [art[r].astype(np.float64)]) for r in rows]
    finite = [v for v in sqnr if np.isfinite(v)]
    assert stats.sqnr_db.record() == {"mean": pytest.approx(np.mean(finite)), "worst": None, "worst_sample": 13}
    cosines = [cosine([ref[r].astype(np.float64)], [art[r].astype(np.float64)]) for r in rows]
    assert stats.cosine.worst == pytest.approx(min(c for c in cosines if not np.isnan(c)))
    top1 = [float(np.mean(ref[r].argmax(-1) == art[r].argmax(-1))) for r in rows if r != 3]
    assert stats.top1.total == pytest.approx(sum(top1) + float(np.mean(ref[3].argmax(-1) == art[3].argmax(-1))))


def test_data_cast_without_data_is_refused(tmp_path):
    report = api.export(MLP, to="onnx", opset=17, out=tmp_path / "m.onnx", data_cast=True)

    assert report.exit_code == 2 and "give --data too" in report.failures[0].message, report.summary_lines()
    assert not (tmp_path / "m.onnx").exists()


def test_data_with_no_verify_is_read_and_the_report_says_it_did_not_run(tmp_path):
    np.savez(tmp_path / "d.npz", input=np.zeros((8, 16), np.float32))

    report = api.export(MLP, to="onnx", opset=17, out=tmp_path / "m.onnx", data=str(tmp_path / "d.npz"), verify=False)

    assert report.exit_code == 0 and report.data["samples"] == 8 and "outputs" not in report.data
    assert any("not run: --no-verify" in note for note in report.notes)
