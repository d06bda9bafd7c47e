"""--calibration data: .npz stacks cut into batches, folders of .npz/.npy, file.py:callable, and the
checks of every feed against the model's inputs."""

import numpy as np
import pytest

from exporter.feed_files import load_calibration
from exporter.sources import InputSpec
from verifiers.errors import BadInput

IMAGE = InputSpec("image", (2, 3), "float32")
IDS = InputSpec("input_ids", (2, 4), "int64")


def test_npz_samples_on_axis_0_are_cut_into_batches(tmp_path):
    images = np.arange(6 * 3, dtype=np.float64).reshape(6, 3)
    ids = np.arange(6 * 4, dtype=np.int32).reshape(6, 4)
    np.savez(tmp_path / "calib.npz", image=images, input_ids=ids)

    feeds = load_calibration(str(tmp_path / "calib.npz"), [IMAGE, IDS])

    assert len(feeds) == 3
    assert [f["image"].dtype for f in feeds] == [np.float32] * 3  # cast within the kind
    assert feeds[1]["input_ids"].dtype == np.int64
    np.testing.assert_array_equal(feeds[2]["image"], images[4:6])


def test_folder_of_npz_and_npy(tmp_path):
    np.savez(tmp_path / "a.npz", image=np.ones((2, 3), np.float32))
    np.save(tmp_path / "image.npy", np.zeros((4, 3), np.float32))  # a stack: two batches
    assert len(load_calibration(str(tmp_path), [IMAGE])) == 3

    single = tmp_path / "single"
    single.mkdir()
    for i in range(2):
        np.save(single / f"batch{i}.npy", np.full((2, 3), i, np.float32))  # one-input model: one batch each
    feeds = load_calibration(str(single), [IMAGE])
    assert [float(f["image"][0, 0]) for f in feeds] == [0.0, 1.0]


def test_callable_yielding_feeds(tmp_path):
    (tmp_path / "data.py").write_text(
        "import numpy as np\n"
        "def feeds():\n"
        "    for i in range(3):\n"
        "        yield {'image': np.full((2, 3), i, np.float32)}\n")
    assert len(load_calibration(f"{tmp_path / 'data.py'}:feeds", [IMAGE])) == 3


@pytest.mark.parametrize("arrays, message", [
    ({"input_ids": np.zeros((2, 4), np.float32)},
     "input 'input_ids': expected int64 of shape 2x4, found float32 of shape 2x4"),
    ({"input_ids": np.zeros((2, 4, 1), np.int64)}, "input 'input_ids': expected int64 of shape 2x4, found int64"),
    ({"input_ids": np.zeros((3, 4), np.int64)}, "input 'input_ids': 3 samples on axis 0 are not a multiple"),
    ({"input_ids": np.zeros((2, 4), np.int64), "mask": np.zeros((2, 4), np.int64)}, "unknown input 'mask'"),
    ({}, "no calibration batches"),
])
def test_bad_npz_is_bad_input_naming_the_input_and_the_file(tmp_path, arrays, message):
    path = tmp_path / "calib.npz"
    np.savez(path, **arrays)
    with pytest.raises(BadInput, match=message) as caught:
        load_calibration(str(path), [IDS])
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_int_data_for_a_float_input_and_missing_inputs_are_bad_input(tmp_path):
    np.save(tmp_path / "image.npy", np.zeros((2, 3), np.uint8))
    with pytest.raises(BadInput, match="input 'image': expected float32 of shape 2x3, found uint8"):
        load_calibration(str(tmp_path), [IMAGE])
    np.save(tmp_path / "image.npy", np.zeros((2, 3), np.float32))
    with pytest.raises(BadInput, match="input 'input_ids' is missing"):
        load_calibration(str(tmp_path), [IMAGE, IDS])


def test_dynamic_axes_may_differ_and_static_ones_may_not(tmp_path):
    path = tmp_path / "calib.npz"
    np.savez(path, input_ids=np.zeros((2, 7), np.int64))
    assert load_calibration(str(path), [IDS], dynamic=[("input_ids", 1)])[0]["input_ids"].shape == (2, 7)
    with pytest.raises(BadInput, match="expected int64 of shape 2x4, found int64 of shape 2x7"):
        load_calibration(str(path), [IDS])
