"""The files a source model is built from: the spec file, the user's modules it imports and the
files it reads while loading, none of Python's or an installed package's, none it only writes."""

import os
from pathlib import Path

import numpy as np

from exporter import api
from exporter.frameworks import load_source


def test_a_load_lists_the_users_modules_and_the_files_it_read_and_nothing_installed(tmp_path):
    np.save(tmp_path / "scale.npy", np.full(4, 0.5, dtype=np.float32))
    (tmp_path / "helper_blocks.py").write_text("import torch\n\nACTIVATION = torch.nn.GELU\n")
    (tmp_path / "model.py").write_text(
        "import os\nimport sys\nfrom pathlib import Path\n\nimport numpy as np\nimport torch\n\n"
        "HERE = Path(__file__).parent\nsys.path.insert(0, str(HERE))\nimport helper_blocks  # noqa: E402\n\n\n"
        "def build():\n"
        "    (HERE / 'build.log').write_text('built')  # written, not read: not an input\n"
        "    os.close(os.open(HERE / 'raw.bin', os.O_RDONLY | os.O_CREAT))  # read through os.open\n"
        "    scale = torch.from_numpy(np.load(HERE / 'scale.npy'))\n"
        "    layer = torch.nn.Linear(4, 4)\n"
        "    with torch.no_grad():\n"
        "        layer.weight.mul_(scale)\n"
        "    return torch.nn.Sequential(layer, helper_blocks.ACTIVATION()).eval(), (torch.randn(2, 4),)\n")
    source = load_source(f"{tmp_path / 'model.py'}:build")
    assert [path.name for path in source.files] == ["helper_blocks.py", "model.py", "raw.bin", "scale.npy"]
    assert all(path.parent == tmp_path.resolve() for path in source.files)


def test_the_report_lists_them_with_their_digests(tmp_path):
    from fixtures.specs import TORCH_MODELS

    report = api.export(f"{TORCH_MODELS}:mlp_exact", to="onnx", opset=17, out=tmp_path / "m.onnx")
    assert report.exit_code == 0
    [listed] = report.source_files
    # (relative to the working directory, which holds it here)
    assert listed["path"] == str(TORCH_MODELS.resolve().relative_to(Path.cwd().resolve()))
    assert len(listed["sha256"]) == 64
    verified = api.verify(tmp_path / "m.onnx", source=f"{TORCH_MODELS}:mlp_exact")
    assert verified.source_files == report.source_files


def test_files_reached_through_links_are_listed_where_they_lie(tmp_path):
    """A weights file that is a link, a module in a linked folder, a path that leaves a linked
    folder by `..`: each listed as the file it really is (os.path.realpath's answer)."""
    real = tmp_path / "real"
    (real / "inner").mkdir(parents=True)
    (real / "inner" / "linked_blocks.py").write_text("import torch\n\nACTIVATION = torch.nn.GELU\n")
    np.save(real / "scale.npy", np.full(4, 0.5, dtype=np.float32))
    (real / "beside.txt").write_text("0.25")
    project = tmp_path / "project"
    project.mkdir()
    (project / "weights.npy").symlink_to(real / "scale.npy")
    (project / "blocks").symlink_to(real / "inner", target_is_directory=True)
    (project / "model.py").write_text(
        "import sys\nfrom pathlib import Path\n\nimport numpy as np\nimport torch\n\n"
        "HERE = Path(__file__).parent\nsys.path.insert(0, str(HERE / 'blocks'))\nimport linked_blocks  # noqa: E402\n\n\n"
        "def build():\n"
        "    scale = torch.from_numpy(np.load(HERE / 'weights.npy'))\n"
        "    offset = float(open(str(HERE / 'blocks') + '/../beside.txt').read())\n"
        "    layer = torch.nn.Linear(4, 4)\n"
        "    with torch.no_grad():\n"
        "        layer.weight.mul_(scale).add_(offset)\n"
        "    return torch.nn.Sequential(layer, linked_blocks.ACTIVATION()).eval(), (torch.randn(2, 4),)\n")
    source = load_source(f"{project / 'model.py'}:build")
    expected = [project / "model.py", project / "weights.npy", project / "blocks" / "linked_blocks.py",
                Path(str(project / "blocks") + "/../beside.txt")]
    assert sorted(source.files) == sorted(Path(os.path.realpath(path)) for path in expected)
