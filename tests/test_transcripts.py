"""Word error rate of a transcribe build: [workload] transcripts decoded by the model directory's tokenizer and scored
by jiwer, judged at build and carried by check, driving the sensitivity loop where the profile sets max_wer; every
bad transcript one line with exit 2 and no build dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import refused_build, run_cli

transformers = pytest.importorskip("transformers")

from test_transcribe import CONFIG, _project, _whisper_dir  # noqa: E402 - after the skip: they import transformers

CLIPS = """import numpy as np

def clips():
    rng = np.random.default_rng(3)
    return [rng.standard_normal((80, 100)).astype(np.float32) * 0.5 for _ in range(4)]

def transcripts():
    return {said}
"""
SAID = ["w3 w4 w5 w6", "w7 w8", "w9 w10 w11"]


def _with_word_tokenizer(tmp_path) -> Path:
    """The test model's directory with a tokenizer whose every id is a word (w0 … w499): what it decodes is text."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = _whisper_dir(tmp_path / "hf")
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(CONFIG["vocab_size"])}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, bos_token="w1", eos_token="w2").save_pretrained(folder)
    return folder


def _wer_project(tmp_path, said=SAID, budget: str = "max_wer = 100"):
    source = _with_word_tokenizer(tmp_path)
    files = {"clips.py": CLIPS.format(said=said)}
    extra = 'clips = "clips.py:clips"\ntranscripts = "clips.py:transcripts"'
    project = _project(tmp_path, extra=extra, files=files, source=str(source))
    toml = (project / "tapeout.toml").read_text().replace("audio_s = [0.5, 1.0]", "audio_s = [1.0]")
    (project / "tapeout.toml").write_text(toml.replace("trials = 10", "trials = 2") + f"\n[budgets]\n{budget}\n")
    return project


@pytest.mark.slow  # two builds and a check
def test_transcripts_give_a_word_error_rate_that_judges_the_build_and_drives_the_loop(tmp_path):
    project = _wer_project(tmp_path)
    out = tmp_path / "fp32"
    result = run_cli("build", project, "--profile", "cpu-fp32", "--out", out, "--json")
    assert result.code == 0, result.err
    wer = result.json()["workload"]["wer"]
    # the FP32 artifact decodes torch's tokens, so its words are torch's, and both are scored against what is said
    assert [c["said"] for c in wer["clips"]] == SAID
    assert [c["artifact"] for c in wer["clips"]] == [c["torch"] for c in wer["clips"]]
    assert all(c["torch"] and set(c["torch"].split()) <= {f"w{i}" for i in range(500)} for c in wer["clips"])
    assert wer["artifact"] == wer["torch"] > 0  # a seeded random model does not say w3 w4 w5 w6
    budget = next(b for b in result.json()["budgets"] if b["budget"] == "max_wer")
    assert budget["verdict"] == "pass" and budget["measured"] == wer["artifact"]
    check = run_cli("check", out, "--json", "--repeats", "1")
    carried = next(b for b in check.json()["budgets"] if b["budget"] == "max_wer")
    assert carried["carried"] and carried["verdict"] == "pass" and "stay on the host" in carried["reason"]
    assert [b["budget"] for b in check.json()["budgets"]].count("max_wer") == 1
    # INT8: the sensitivity loop judges the decoder's candidates by their word error rate, as the build does
    toml = (project / "tapeout.toml").read_text().replace("max_wer = 100", f"max_wer = {wer['torch']}")
    (project / "tapeout.toml").write_text(toml)
    result = run_cli("build", project, "--profile", "cpu-int8", "--out", tmp_path / "int8", "--json")
    assert result.code in (0, 1), result.err
    assert "and evaluate word error rate (against [workload] transcripts on 3 golden clips" in result.err
    report = result.json()
    search = report["quantization"]["search"]
    assert search["metric"] == report["workload"]["wer"]["artifact"]
    met = next(b for b in report["budgets"] if b["budget"] == "max_wer")["verdict"] == "pass"
    assert met == (search["metric"] <= wer["torch"])


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda p: p.write_text(p.read_text().replace('clips = "clips.py:clips"\n', "")), "the project gives no clips"),
        (lambda p: p.write_text(p.read_text().replace("transcripts = ", "# ")), "max_wer = 100 needs what is said"),
        (lambda p: (p.parent / "clips.py").write_text(CLIPS.format(said=["a b"])), "gave 1 texts for 3 golden clips"),
        (lambda p: (p.parent / "clips.py").write_text(CLIPS.format(said=["a", 2, "c"])), "item 1 is int, not a string"),
        (lambda p: (p.parent / "clips.py").write_text(CLIPS.format(said=["", " ", ""])), "hold no words"),
    ],
)
def test_bad_transcripts_are_one_line(tmp_path, change, says):
    project = _wer_project(tmp_path)
    change(project / "tapeout.toml")
    assert says in refused_build(tmp_path, project)


def test_transcripts_need_a_tokenizer(tmp_path):
    project = _wer_project(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (tmp_path / "hf" / name).unlink(missing_ok=True)
    line = refused_build(tmp_path, project)
    assert "the model has no tokenizer to turn its tokens into words" in line
