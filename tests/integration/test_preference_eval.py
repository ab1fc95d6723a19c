"""``leantrain eval`` of a preference-tuned policy.

A DPO + LoRA model needs no more memory than the run's own evaluation: the same batch width (the run's, recorded
with the model), the chunked output layer on the policy AND on the reference it loads (no ``tokens x vocabulary``
fp32 logits), the run's precision. A tiny Llama with a 65,536-word output layer makes the plain logits of an eval
batch several times one chunk's, so a skipped chunked path shows as the largest tensor.

And what cannot be evaluated is refused first (exit 2, no traceback, before the policy or the data load): a reference
folder deleted or moved since the run; a policy tuned from ``model.config`` (its reference was never saved)."""

from __future__ import annotations

import json

import pytest

from leantrain.cli import main
from leantrain.modeling.chunked_loss import default_chunk_tokens
from tests.helpers import (CHATML, TINY_LLAMA, LargestTensor, make_tiny_chat_tokenizer, make_tiny_llama,
                           write_jsonl)

pytestmark = pytest.mark.usefixtures("own_datasets_cache")
VOCAB = 2**16
LONG = "Once upon a time there was a small model. It learned to answer questions about the weather. " * 2


def pairs(n: int, seed: int) -> list[dict]:
    return [{"prompt": f"{LONG} What is {i} + {seed}?", "chosen": "The answer is 4.", "rejected": "Numbers."}
            for i in range(n)]


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory):
    pytest.importorskip("peft")
    root = tmp_path_factory.mktemp("evalmem")
    tok = make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML)
    make_tiny_llama(root / "llama", tok, layers=1, hidden=16, vocab_size=VOCAB)
    write_jsonl(root / "train.jsonl", pairs(4, 0))
    write_jsonl(root / "dev.jsonl", pairs(6, 1))
    assert main(["train", f"model.name={root / 'llama'}", f"data.train={root / 'train.jsonl'}",
                 f"data.eval={root / 'dev.jsonl'}", "data.block_size=128", "train.batch_size=2",
                 "train.micro_batch_size=1", "train.max_steps=1", "peft.method=lora", "peft.r=2",
                 "report.plots=false", "report.progress=none", "efficiency.precision=fp32",
                 "checkpoint.every_steps=0", f"output_dir={root / 'run'}"]) == 0
    return root


def test_eval_of_a_dpo_lora_model_keeps_the_runs_width_and_the_chunked_layer_on_policy_and_reference(dpo_run,
                                                                                                     tmp_path):
    run = dpo_run / "run"
    recorded = json.loads((run / "model" / "leantrain.json").read_text())
    assert recorded["eval_batch_size"] == 2  # the run's own evaluation: 2 x its micro-batch of 1
    out = tmp_path / "m.json"
    with LargestTensor() as seen:
        assert main(["eval", str(run / "model"), f"data.eval={dpo_run / 'dev.jsonl'}", "--output", str(out)]) == 0
    got = json.loads(out.read_text())["eval"]
    assert got["samples"] == 6
    assert got["reward_accuracy"] == pytest.approx(json.loads((run / "summary.json").read_text())["eval"]
                                                   ["reward_accuracy"])
    assert seen.rows <= 2 * 2  # 2 pairs a batch, as the run evaluated: 4 sequences
    chunk = default_chunk_tokens(VOCAB, "cpu") * VOCAB * 4  # one chunk's fp32 logits
    assert seen.bytes <= chunk, f"{seen.bytes / 2**20:.0f} MiB allocated at once; one chunk's logits are " \
                                f"{chunk / 2**20:.0f} MiB"


def test_eval_against_a_reference_folder_that_was_moved_exits_2_naming_it(dpo_run, capsys):
    base, moved = dpo_run / "llama", dpo_run / "llama-moved"
    base.rename(moved)
    try:
        code = main(["eval", str(dpo_run / "run" / "model"), f"data.eval={dpo_run / 'missing.jsonl'}"])
    finally:
        moved.rename(base)
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert f"reference model {base}" in err and "no such folder" in err and "Traceback" not in err
    assert "missing.jsonl" not in err  # refused before the data loads


def test_eval_of_a_policy_tuned_from_a_config_is_refused_first(dpo_run, capsys):
    out = dpo_run / "scratch"
    assert main(["train", *TINY_LLAMA, f"model.tokenizer={dpo_run / 'tok'}", f"data.train={dpo_run / 'train.jsonl'}",
                 "data.block_size=64", "train.batch_size=2", "train.max_steps=1", "report.plots=false",
                 "report.progress=none", "checkpoint.every_steps=0", f"output_dir={out}"]) == 0
    capsys.readouterr()
    assert main(["eval", str(out / "model"), f"data.eval={dpo_run / 'missing.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "built from model.config with random weights that were not saved" in err and "Traceback" not in err
    assert "not supported yet" not in err and "missing.jsonl" not in err  # refused before the model and the data
