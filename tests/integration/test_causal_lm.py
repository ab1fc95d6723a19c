"""Causal LMs end to end (tiny Llama from a config, a 152-word tokenizer, CPU, fp32): the global token-mean loss is
the same for 1 process x accumulation 4, 2 x 2 and 4 x 1, with document masking so that every block holds a different
number of targets, and padding micro-batches (the 2-process runs, plain and FSDP, are one torchrun launch); a run
SIGKILLed mid-epoch resumes bitwise (and so does DPO on preference pairs, with its reference the LoRA adapters off or
precomputed); the saved model loads with pipeline("text-generation") and `leantrain eval` reports training's eval
loss; sample continuations land in metrics.jsonl; a short run on tiny-shakespeare ends far below the uniform
perplexity."""

from __future__ import annotations

import collections
import json
import random
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml

from leantrain import train
from leantrain.cli import main
from leantrain.report.logs import read_metrics
from tests.helpers import (LM_WORDS, TINY_LLAMA, cli_here, cli_process, lm_documents, make_tiny_lm_tokenizer,
                           model_params, shared_data, train_here, write_jsonl)
from tests.processes import assert_same_training, two_processes_each

SAMPLE = "ba be"


def _overrides_to_dict(overrides: list[str]) -> dict:
    """TINY_LLAMA's key=value list as the nested dict of a YAML config."""
    out: dict = {}
    for item in overrides:
        key, value = item.split("=", 1)
        *path, last = key.split(".")
        node = out
        for p in path:
            node = node.setdefault(p, {})
        node[last] = yaml.safe_load(value)
    return out


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """Tokenizer, corpus (documents separated by blank lines) and the 1 x accumulation 4 reference run."""
    root = tmp_path_factory.mktemp("clm")
    tok = make_tiny_lm_tokenizer(root / "tok")
    (root / "train.txt").write_text("\n\n".join(lm_documents(60, 0)))
    (root / "valid.txt").write_text("\n\n".join(lm_documents(20, 1)))
    cfg = _overrides_to_dict(TINY_LLAMA)
    cfg["model"].update({"tokenizer": str(tok), "task": "causal-lm"})
    cfg.update({
        "data": {"train": str(root / "train.txt"), "eval": str(root / "valid.txt"), "block_size": 16,
                 "document_separator": "\n\n", "document_mask": True,  # targets differ from block to block
                 "max_train_samples": 42, "max_eval_samples": 13},  # a last batch of 2 blocks; uneven eval shards
        "train": {"batch_size": 8, "micro_batch_size": 2, "max_steps": 6, "lr": 3e-3, "log_every_steps": 1,
                  "seed": 7, "eval_every_steps": 3},
        "report": {"plots": False, "progress": "plain", "sample_prompts": [SAMPLE], "sample_max_new_tokens": 3},
        "efficiency": {"precision": "fp32"},
    })
    path = root / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    summary = train(path, [f"output_dir={root / 'single'}"])
    assert summary["train"]["accumulation_steps"] == 4 and summary["train"]["steps"] == 6
    return root, path, summary


def test_causal_lm_run_reports_token_mean_loss_perplexity_and_target_tokens(lm):
    root, _, summary = lm
    ev, tr = summary["eval"], summary["train"]
    assert ev["perplexity"] == pytest.approx(torch.tensor(ev["loss"]).exp().item(), rel=1e-6)
    assert 0 < ev["tokens"] < 13 * 15  # document starts carry no target
    assert tr["tokens_per_second"] > 0 and tr["mfu"] is not None and tr["peak_memory_bytes"] > 0
    blocks_seen = 6 * 8 - 6  # 42 blocks in epoch 1 (6 steps, the last holding 2 real blocks); no more
    assert tr["tokens_seen"] < blocks_seen * 15  # targets, not input tokens (some first tokens have none)
    samples = [r for r in read_metrics(root / "single" / "metrics.jsonl") if r["type"] == "samples"]
    assert [r["step"] for r in samples] == [0, 3, 6]  # before training and at each evaluation
    assert all(r["samples"][0]["prompt"] == SAMPLE and isinstance(r["samples"][0]["continuation"], str)
               for r in samples)


@pytest.fixture(scope="module")
def two(lm) -> Path:
    """lm's config on 2 processes (gloo), both runs in one torchrun launch: as configured (2 x accumulation 2) in
    <root>/two/p2/p2, and under FSDP for 2 steps, evaluating (and sampling) after each, in <root>/two/fsdp/p2."""
    root, path, _ = lm
    cfg = yaml.safe_load(path.read_text())
    fsdp = {**cfg, "distributed": {"strategy": "fsdp"},
            "train": {**cfg["train"], "max_steps": 2, "eval_every_steps": 1}}
    (root / "two").mkdir()
    two_processes_each(root / "two", {"p2": cfg, "fsdp": fsdp})
    return root / "two"


@pytest.mark.slow
@pytest.mark.distributed
def test_loss_normalisation_1x4_equals_2x2_equals_4x1(lm, two):
    root, path, _ = lm
    single, p2 = root / "single", two / "p2" / "p2"
    assert json.loads((p2 / "summary.json").read_text())["train"]["accumulation_steps"] == 2
    train(path, [f"output_dir={root / 'm8'}", "train.micro_batch_size=8"])
    assert json.loads((root / "m8" / "summary.json").read_text())["train"]["accumulation_steps"] == 1
    for other in (p2, root / "m8"):
        assert_same_training(single, other)
        ea, eb = (json.loads((d / "summary.json").read_text())["eval"] for d in (single, other))
        assert ea["samples"] == eb["samples"] == 13 and ea["tokens"] == eb["tokens"]  # no duplicated eval rows
        assert ea["loss"] == pytest.approx(eb["loss"], rel=1e-5)
    samples = [r for r in read_metrics(p2 / "metrics.jsonl") if r["type"] == "samples"]
    assert [r["step"] for r in samples] == [0, 3, 6]  # rank 0 wrote them once each


def test_saved_model_loads_with_pipeline_and_eval_matches_training(lm, tmp_path, capsys):
    from transformers import pipeline

    root, _, summary = lm
    model_dir = root / "single" / "model"
    gen = pipeline("text-generation", model=str(model_dir))
    out = gen(SAMPLE, max_new_tokens=3, do_sample=False)
    assert out[0]["generated_text"].startswith(SAMPLE)
    card = (model_dir / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card and "| block size | 16 |" in card
    assert "final eval perplexity" in card and "## Labels" not in card
    output = tmp_path / "eval.json"
    # the run's block size, document separator and mask come from model/leantrain.json
    assert main(["eval", str(model_dir), f"data.eval={root / 'valid.txt'}", "data.max_eval_samples=13",
                 "--output", str(output)]) == 0
    got = json.loads(output.read_text())["eval"]
    assert got["tokens"] == summary["eval"]["tokens"]
    assert got["loss"] == pytest.approx(summary["eval"]["loss"], rel=1e-5)
    assert got["perplexity"] == pytest.approx(summary["eval"]["perplexity"], rel=1e-5)


def _pair_rows(n: int, seed: int) -> list[dict]:
    """Seeded prompt / chosen / rejected pairs of the tokenizer's words."""
    r = random.Random(seed)
    words = lambda k: " ".join(r.choice(LM_WORDS) for _ in range(k))  # noqa: E731
    return [{"prompt": words(r.randint(2, 6)), "chosen": words(r.randint(1, 8)), "rejected": words(r.randint(1, 8))}
            for _ in range(n)]


def _resume_data(root: Path, case: str) -> list[str]:
    """The data of a kill-and-resume case: the corpus in blocks of 16 (causal-lm), or 24 / 8 preference pairs (DPO:
    with LoRA the reference is the model with its adapters off; without, its log-probs are precomputed once and the
    resumed process reads them back)."""
    if case == "causal-lm":
        return [f"data.train={root / 'train.txt'}", f"data.eval={root / 'valid.txt'}", "data.block_size=16"]
    for name, n, seed in (("prefs.jsonl", 24, 0), ("prefs_dev.jsonl", 8, 1)):
        write_jsonl(root / name, _pair_rows(n, seed))
    pairs = [f"data.train={root / 'prefs.jsonl'}", f"data.eval={root / 'prefs_dev.jsonl'}", "data.block_size=32"]
    return pairs + (["peft.method=lora", "peft.r=4", "peft.alpha=8"] if case == "dpo-adapter"
                    else ["preference.reference=precompute"])


def _resume_args(root: Path, out: Path, data: list[str]) -> list[str]:
    return [*TINY_LLAMA, f"model.tokenizer={root / 'tok'}", "model.config_overrides.attention_dropout=0.1", *data,
            "data.max_train_samples=24", "data.max_eval_samples=8", "train.batch_size=8",
            "train.micro_batch_size=4", "train.epochs=2", "train.lr=3e-3", "train.log_every_steps=1",
            "train.eval_every_steps=3", "checkpoint.every_steps=2", "checkpoint.keep=2", "checkpoint.keep_final=2",
            "report.plots=false", "report.progress=none", f"output_dir={out}"]


def _train_process(root: Path, out: Path, data: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return cli_process("train", *_resume_args(root, out, data), env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["causal-lm", "dpo-adapter", "dpo-precompute"])
def test_sigkill_mid_epoch_resumes_bitwise(lm, case):
    """24 blocks (or pairs), batch 8 -> 3 steps/epoch, 6 steps; checkpoints at 2 and 4; SIGKILL after step 5 ->
    resumes at step 4, the first step of epoch 2 done (mid-epoch); attention dropout on (and LoRA's), so a lost RNG
    state would show. DPO: a tiny Llama from a config, its reference the adapters off (LoRA) or precomputed."""
    root = lm[0]
    data = _resume_data(root, case)
    ref_dir, resumed_dir = root / f"ref-{case}", root / f"resumed-{case}"
    with ThreadPoolExecutor(1) as pool:  # the killed process meanwhile; the reference in this process
        killed_job = pool.submit(_train_process, root, resumed_dir, data, {"LEANTRAIN_TEST_KILL_AT_STEP": "5"})
        assert train_here(_resume_args(root, ref_dir, data))["train"]["steps"] == 6
        killed = killed_job.result()
    assert killed.returncode == -9, killed.stderr[-3000:]
    final = cli_here("train", *_resume_args(root, resumed_dir, data))  # resumed in this process
    assert final.returncode == 0, final.stderr[-3000:]
    if case != "causal-lm":
        assert "task: preference" in final.stderr
    if case == "dpo-precompute":  # the reference log-probs of the model as it starts: computed before, read back
        assert "train data: ref_chosen_logps, ref_rejected_logps read from" in final.stderr
    keep = ("type", "step", "loss", "lr", "grad_norm", "eval.loss", "eval.perplexity", "eval.reward_accuracy",
            "eval.reward_margin", "eval.chosen_logps")
    got = [{k: r[k] for k in keep if k in r} for r in read_metrics(resumed_dir / "metrics.jsonl")]
    want = [{k: r[k] for k in keep if k in r} for r in read_metrics(ref_dir / "metrics.jsonl")]
    assert [r["step"] for r in got if r["type"] == "train"] == list(range(1, 7))
    assert any("eval.loss" in r for r in got)
    assert got == want  # bitwise: floats are written with repr
    assert json.loads((resumed_dir / "summary.json").read_text())["train"]["resumed_from_step"] == 4
    a, b = model_params(ref_dir), model_params(resumed_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_tiny_shakespeare_perplexity_far_below_uniform(tmp_path):
    """A 2-layer Llama (hidden 64) from a config, a 500-word tokenizer built from the training text, 80 steps of
    blocks of 64: the eval perplexity is far below the vocabulary size (a uniform guess)."""
    data = shared_data("tinyshakespeare")
    words = collections.Counter((data / "train.txt").read_text().split())
    tok = make_tiny_lm_tokenizer(tmp_path / "tok", words=[w for w, _ in words.most_common(498)])
    vocab = 500
    summary = train(None, [*TINY_LLAMA, "model.config_overrides.hidden_size=64",
                           "model.config_overrides.intermediate_size=128", f"model.tokenizer={tok}",
                           f"data.train={data / 'train.txt'}", f"data.eval={data / 'valid.txt'}",
                           "data.block_size=64", "data.max_eval_samples=64", "train.batch_size=16",
                           "train.max_steps=80", "train.lr=5e-3", "train.log_every_steps=40",
                           "report.plots=false", "report.progress=none", "checkpoint.every_steps=0",
                           f"output_dir={tmp_path / 'run'}"])
    ppl = summary["eval"]["perplexity"]
    assert ppl < vocab / 4, ppl
    assert summary["model"]["class"] == "LlamaForCausalLM"


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_two_processes_with_sample_prompts(two):
    """Under FSDP every rank joins the generation (each forward gathers the sharded weights), and training goes on
    after it (no inference tensors left in FSDP's gathered parameters); rank 0 writes each samples record once."""
    out = two / "fsdp" / "p2"
    samples = [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["type"] == "samples"]
    assert samples == [0, 1, 2]
    assert json.loads((out / "summary.json").read_text())["distributed"]["strategy"] == "fsdp"
