"""What a CI job page shows: the Markdown summary (--summary, or appended to
$GITHUB_STEP_SUMMARY) and, on GitHub Actions, one error annotation per failure."""

from fixtures.make_broken_onnx import build_fixture
from fixtures.specs import torch_model


def test_on_github_actions_each_run_appends_its_summary_and_annotates_its_failures(cli, tmp_path):
    fixture = build_fixture("exact_to_tanh", tmp_path)
    step_summary = tmp_path / "step_summary.md"
    github = {"GITHUB_STEP_SUMMARY": str(step_summary), "GITHUB_ACTIONS": "true"}
    broken = cli("verify", fixture.path, "--source", fixture.source, env=github)
    assert broken.returncode == 3
    annotations = [line for line in broken.stderr.splitlines() if line.startswith("::error ")]
    assert len(annotations) == len(fixture.changed_sites)
    assert annotations[0].startswith(f"::error title=exportgate gelu%3A {fixture.path}::GELU changed: source ")
    passing = cli("export", torch_model("mlp_exact"), "--to", "onnx", "--opset", "17", "--out", "m.onnx", env=github)
    assert passing.returncode == 0 and "::error" not in passing.stderr
    text = step_summary.read_text()
    assert text.count("### exportgate: ") == 2
    assert "### exportgate: FAIL" in text and "❌ fail | 3" in text and "- `gelu`: GELU changed" in text
    assert "### exportgate: PASS" in text and "✅ pass | 0" in text


def test_summary_option_writes_markdown_off_ci(cli, tmp_path):
    result = cli("export", torch_model("sign_branch"), "--to", "onnx", "--opset", "17", "--out", "m.onnx",
                 "--summary", "summary.md")
    assert result.returncode == 1 and "::error" not in result.stderr
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("### exportgate: FAIL\n") and "- `numeric`: output output: max abs err" in text
