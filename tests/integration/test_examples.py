"""examples/: every YAML loads and validates through the real config loader; the small ones train for 2 steps
(a tiny random BERT, ViT or Llama, tiny generated data: the examples' data keys are overridden). ddp-cpu.yaml trains
as 2 processes in test_distributed.py, in the launch of its other 2-process runs."""

import random
import re
import subprocess

import pytest

from tests.helpers import CHATML, REPO, TINY_LLAMA, make_tiny_chat_tokenizer, write_jsonl, write_rows
from leantrain import train
from leantrain.config import Config, load_yaml, resolve

EXAMPLES = REPO / "examples"
YAMLS = sorted(EXAMPLES.glob("*.yaml"))
EXPECTED = {"text-classification.yaml", "sentence-pairs.yaml", "image-folder.yaml", "audio.yaml",
            "vit-from-scratch.yaml", "ddp-cpu.yaml", "fsdp.yaml", "multi-node.yaml", "slurm.sbatch"}
WORDS = {"pos": ["great", "lovely", "superb", "fine"], "neg": ["awful", "bad", "broken", "poor"]}


def test_every_promised_example_is_there_and_listed():
    names = {p.name for p in EXAMPLES.iterdir()}
    assert EXPECTED <= names, EXPECTED - names
    index = (EXAMPLES / "README.md").read_text()
    for name in sorted(names - {"README.md"}):
        assert f"]({name})" in index, f"examples/README.md does not list {name}"


@pytest.mark.parametrize("path", YAMLS, ids=[p.name for p in YAMLS])
def test_example_loads_and_validates(path):
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# ") and len(lines[0]) <= 130, "a one-line comment header saying what it is"
    assert f"examples/{path.name}" in "\n".join(l for l in lines if l.startswith("#")), "the header gives the command"
    cfg = resolve(path)
    assert isinstance(cfg, Config)
    assert load_yaml(path), "an empty example"


def test_slurm_script_is_valid_bash_and_runs_an_example():
    script = EXAMPLES / "slurm.sbatch"
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --nodes=" in text
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    used = re.findall(r"examples/[\w.-]+\.yaml", text)
    assert used and all((REPO / u).is_file() for u in used), used


def _texts(n, seed):
    r = random.Random(seed)
    for _ in range(n):
        lab = r.choice(["pos", "neg"])
        yield lab, " ".join(r.choice(WORDS[lab]) for _ in range(r.randint(1, 10)))


def _run(name, tmp_path, data_overrides):
    out = tmp_path / "run"
    summary = train(str(EXAMPLES / name), [*data_overrides, "train.max_steps=2", f"output_dir={out}",
                                           "report.plots=false", "checkpoint.every_steps=0"])
    assert summary["train"]["steps"] == 2 and (out / "model" / "config.json").is_file()
    return summary


@pytest.mark.parametrize("name", ["text-classification.yaml", "ddp-cpu.yaml"])
def test_text_example_trains_two_steps(name, tmp_path, tiny_bert):
    rows = lambda n, s: [{"text": t, "label": lab} for lab, t in _texts(n, s)]  # noqa: E731
    train_f, dev_f = write_rows(tmp_path / "train.csv", rows(80, 0)), write_rows(tmp_path / "dev.csv", rows(20, 1))
    summary = _run(name, tmp_path, [f"model.name={tiny_bert}", f"data.train={train_f}", f"data.eval={dev_f}"])
    assert summary["model"]["labels"] == ["neg", "pos"]


def test_sentence_pairs_example_trains_two_steps(tmp_path, tiny_bert):
    def rows(n, seed):
        pairs = zip(_texts(n, seed), _texts(n, seed + 100))
        return [{"sentence1": a, "sentence2": b, "label": int(la == lb)} for (la, a), (lb, b) in pairs]

    train_f = write_rows(tmp_path / "train.tsv", rows(80, 0), sep="\t")
    dev_f = write_rows(tmp_path / "dev.tsv", rows(20, 1), sep="\t")
    summary = _run("sentence-pairs.yaml", tmp_path,
                   [f"model.name={tiny_bert}", f"data.train={train_f}", f"data.eval={dev_f}"])
    assert summary["model"]["labels"] == ["not_paraphrase", "paraphrase"]


def test_vit_from_scratch_example_trains_two_steps(tmp_path):
    """The example's own model config (its config_overrides are real ViT keys), on a few generated 32-px images."""
    from PIL import Image

    r = random.Random(0)
    for split, n in (("train", 12), ("test", 4)):
        for cls, base in (("dark", 40), ("light", 200)):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.new("RGB", (32, 32), tuple(base + r.randint(0, 40) for _ in range(3))).save(
                    tmp_path / split / cls / f"{i}.png")
    summary = _run("vit-from-scratch.yaml", tmp_path, [f"data.train={tmp_path / 'train'}",
                                                       f"data.eval={tmp_path / 'test'}", "train.batch_size=8"])
    assert summary["model"]["labels"] == ["dark", "light"]


def test_grpo_gsm8k_example_trains_two_steps_on_its_generated_problems(tmp_path):
    """The example's rewards, weights and data shape (word_problems rows) on a tiny Llama from a config: its math and
    format rewards pass the dry call and score every completion; 8 new tokens instead of 256."""
    from leantrain.data.lm import word_problems

    train_rows, eval_rows = word_problems.build(n_train=16, n_eval=4)
    tok = make_tiny_chat_tokenizer(tmp_path / "tok", chat_template=CHATML)
    summary = _run("grpo-gsm8k.yaml", tmp_path, [
        "model.name=null", *TINY_LLAMA, f"model.tokenizer={tok}", "grpo.max_new_tokens=8",
        f"data.train={write_jsonl(tmp_path / 'train.jsonl', train_rows)}",
        f"data.eval={write_jsonl(tmp_path / 'eval.jsonl', eval_rows)}"])
    assert {"rewards/math:answer", "rewards/format:boxed"} <= set(summary["eval"])


def test_grpo_calculator_example_runs_its_environment_for_two_steps(tmp_path):
    """The example's environment (examples/calculator_env.py) and built-in problems on a tiny Llama from a config:
    the rows open as its episodes, the episodes are logged with their statistics; 8 new tokens a turn."""
    from leantrain.data.lm import calculator_problems

    train_rows, eval_rows = calculator_problems.build(n_train=16, n_eval=4)
    tok = make_tiny_chat_tokenizer(tmp_path / "tok", chat_template=CHATML)
    summary = _run("grpo-calculator.yaml", tmp_path, [
        "model.name=null", *TINY_LLAMA, f"model.tokenizer={tok}", "grpo.max_new_tokens=8",
        f"grpo.environment={EXAMPLES / 'calculator_env.py'}:Calculator",
        f"data.train={write_jsonl(tmp_path / 'train.jsonl', train_rows)}",
        f"data.eval={write_jsonl(tmp_path / 'eval.jsonl', eval_rows)}"])
    assert {"episodes/turns", "episodes/tool_calls", "rewards/environment"} <= set(summary["eval"])
