"""Every task keeps the global normalisation: 1 process x accumulation 4 == 2 processes x accumulation 2 (2 CPU
processes on gloo, fp32; 42 rows with batch 8, so the last batch of 2 leaves micro-batches of padding; 13 eval rows,
uneven shards): text regression (mse; huber on standardised targets), multi-label, token classification, class
weights, LoRA and instruction tuning (packed and not); and frozen weights stay untouched under FSDP. Beside them, the
same engine for every modality and method: audio (an FSDD slice of ../shared/data) on 2 processes == 1 process x
accumulation 2; GRPO's rollout metrics on 2 processes are the means over both processes' completions, and so are
the step metrics a method returns beside its loss (a test method of tests/method_tasks.py, registered in the workers).

The 2-process runs of all of them are one torchrun launch whose two workers train the configs in turn
(``tests.processes.two_processes_each``): a launch costs mostly its workers' imports, paid here once instead of once
per task. Each test trains its 1-process reference in this process and compares. `leantrain train --nproc` itself (its
checks, its torchrun) is tested in test_distributed.py and by the multi-process tests of the other files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from leantrain import train
from leantrain.config.read import overrides_tree
from leantrain.report.logs import read_metrics
from tests.helpers import (CHATML, SHARED_DATA, TINY_AST, YES_NO, alpaca_rows, distill_args, grpo_args,
                           make_tiny_chat_tokenizer, make_tiny_llama, model_params, ner_rows, score_rows, set_rows,
                           shared_data, uneven_rows, word_rows, write_distill_files, write_fsdd4, write_grpo_files,
                           write_jsonl, write_rows)
from tests.method_tasks import METERED, label_mean, register_methods, unregister_methods
from tests.processes import equals_one_process, two_processes_each

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
TRAIN = {"batch_size": 8, "micro_batch_size": 2, "epochs": 1, "lr": 1e-3, "log_every_steps": 1, "seed": 7}


def _config(model: Path, data: dict, train: dict = TRAIN, **sections) -> dict:
    return {"model": {"name": str(model)}, "data": data, "train": train,
            "report": {"plots": False, "progress": "plain"}, "efficiency": {"precision": "fp32"}, **sections}


def _files(root: Path, name: str, rows, ext: str = "csv") -> dict:
    """``rows(n, seed)`` as 42 training and 13 eval rows in root/<name>-train.<ext> and root/<name>-eval.<ext>."""
    write = write_rows if ext == "csv" else write_jsonl
    return {"train": str(write(root / f"{name}-train.{ext}", rows(42, 0))),
            "eval": str(write(root / f"{name}-eval.{ext}", rows(13, 1)))}


def _configs(root: Path, bert: Path, llama: Path) -> dict[str, dict]:
    sft = lambda packing: _config(  # noqa: E731
        llama, {"train": str(write_jsonl(root / "sft-train.jsonl", alpaca_rows(40, 0))),
                "eval": str(write_jsonl(root / "sft-eval.jsonl", alpaca_rows(7, 1))), "block_size": 64,
                "packing": packing},
        {**{k: v for k, v in TRAIN.items() if k != "epochs"}, "max_steps": 6},
        report={"plots": False, "progress": "plain", "sample_prompts": ["what is two and two"],
                "sample_max_new_tokens": 4})
    yes_no = _files(root, "yes-no", lambda n, seed: word_rows(n, seed, max_words=20, words=YES_NO))
    return {
        "regression": _config(bert, {**_files(root, "scores", score_rows), "label_column": "score"}),
        "huber": _config(bert, {**_files(root, "scores", score_rows), "label_column": "score",
                                "standardize_targets": True}, {**TRAIN, "loss": "huber", "huber_delta": 0.5}),
        "multilabel": _config(bert, _files(root, "sets", set_rows, "jsonl")),
        "tags": _config(bert, _files(root, "ner", ner_rows, "jsonl"), {**TRAIN, "lr": 3e-3}),
        "class_weights": _config(bert, _files(root, "uneven", uneven_rows), {**TRAIN, "class_weights": "balanced"}),
        "lora": _config(bert, yes_no, {**TRAIN, "lr": 1e-2},
                        peft={"method": "lora", "r": 4, "dropout": 0.0}),  # no per-process masks
        "sft_packed": sft(True),
        "sft_unpacked": sft(False),
        "freeze_fsdp": {**_config(bert, yes_no, distributed={"strategy": "fsdp"}),
                        "model": {"name": str(bert), "freeze": ["embeddings", "encoder.layer.0"]}},
    }


def _other_configs(root: Path, bert: Path) -> dict[str, dict]:
    """The metered test method (16 rows, 2 epochs of 2 steps), GRPO, greedy (every process generates what one process
    would), distillation on the data's completions (off-policy: nothing sampled), and audio on an FSDD slice where
    ../shared/data has one (else its test skips, or fails where the shared data is required)."""
    grpo = write_grpo_files(root / "grpo-data")
    metered = {"train": str(write_rows(root / "metered-train.csv", word_rows(16, 0, max_words=8, words=YES_NO))),
               "eval": str(write_rows(root / "metered-eval.csv", word_rows(6, 1, max_words=8, words=YES_NO)))}
    distill = write_distill_files(root / "distill-data")
    configs = {"grpo": overrides_tree(grpo_args(grpo, root / "grpo" / "p2", "train.max_steps=2",
                                                "grpo.temperature=0.0")),
               "distill": overrides_tree(distill_args(distill, root / "distill" / "p2", "train.max_steps=6",
                                                      "train.batch_size=8", "distill.lmbda=0")),
               "metered": {**_config(bert, metered, {"batch_size": 8, "micro_batch_size": 2, "epochs": 2, "lr": 1e-3,
                                                     "log_every_steps": 2, "seed": 3},
                                     checkpoint={"every_steps": 1, "keep": 4}),
                           "model": {"name": str(bert), "task": METERED}}}
    if (SHARED_DATA / "fsdd").is_dir():
        (root / "fsdd4").mkdir()
        train_csv, test_csv = write_fsdd4(root / "fsdd4")
        configs["audio"] = overrides_tree([*TINY_AST, f"data.train={train_csv}", f"data.eval={test_csv}",
                                           "train.max_steps=4", "train.batch_size=8", "train.micro_batch_size=4",
                                           "train.lr=3e-3", "efficiency.precision=fp32", "report.plots=false"])
    return configs


@pytest.fixture(scope="module")
def two(tmp_path_factory, tiny_bert) -> dict[str, Path]:
    """Every task's config file, its 2-process run already in <config>/p2 (one launch, its log in launch.log)."""
    root = tmp_path_factory.mktemp("tasks-2p")
    llama = make_tiny_llama(root / "llama", make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML))
    return two_processes_each(root, {**_configs(root, tiny_bert, llama), **_other_configs(root, tiny_bert)},
                              prelude="from tests.method_tasks import register_methods\nregister_methods()")


def _eval(*runs: Path) -> list[dict]:
    return [json.loads((d / "summary.json").read_text())["eval"] for d in runs]


def test_regression_two_processes_accumulation_two_equals_one_process(two):
    ea, eb = _eval(*equals_one_process(two["regression"]))
    assert ea["samples"] == eb["samples"] == 13
    # mse pins the predictions (equal to ~1e-9 here); pearson of 13 nearly constant predictions divides by their tiny
    # spread, so the last-bit differences of the 2-process sums move it by ~1e-4
    assert ea["mse"] == pytest.approx(eb["mse"], rel=1e-5) and ea["pearson"] == pytest.approx(eb["pearson"], abs=1e-3)


def test_huber_loss_and_standardised_targets_two_processes_equal_one(two):
    """train.loss=huber with data.standardize_targets: each process standardises with the same training-split mean
    and std, and the Huber sum / global example count keeps 1 x 4 == 2 x 2."""
    a, b = equals_one_process(two["huber"])
    ea, eb = _eval(a, b)
    assert ea["samples"] == eb["samples"] == 13
    assert ea["loss"] == pytest.approx(eb["loss"], rel=1e-5) and ea["mse"] == pytest.approx(eb["mse"], rel=1e-5)
    za, zb = (json.loads((d / "model" / "config.json").read_text())["target_standardization"] for d in (a, b))
    assert za == zb


def test_multilabel_two_processes_accumulation_two_equals_one_process(two):
    """Examples x labels of the global batch."""
    ea, eb = _eval(*equals_one_process(two["multilabel"]))
    assert ea["samples"] == eb["samples"] == 13
    for name in ("f1_micro", "f1_macro", "subset_accuracy", "loss"):
        assert ea[name] == pytest.approx(eb[name], rel=1e-5, abs=1e-6), name


def test_token_classification_two_processes_accumulation_two_equals_one_process(two):
    """Labelled sub-tokens of the global batch; eval shards of different widths."""
    ea, eb = _eval(*equals_one_process(two["tags"]))
    assert ea["samples"] == eb["samples"] == 13
    assert ea["entity_f1"] == eb["entity_f1"] and ea["token_accuracy"] == eb["token_accuracy"]
    assert ea["loss"] == pytest.approx(eb["loss"], rel=1e-5)


def test_balanced_two_processes_accumulation_two_equals_one_process(two):
    """train.class_weights=balanced (about 10 pos in 42 rows): the loss is divided by the sum of the weights of the
    global batch; the eval records say what was used."""
    a, b = equals_one_process(two["class_weights"])
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    weights = {w["label"]: w["weight"] for w in sa["train"]["class_weights"]}
    assert weights["pos"] > 1.0 > weights["neg"] and sa["train"]["class_weights"] == sb["train"]["class_weights"]
    assert sb["train"]["accumulation_steps"] == 2
    ev = [rec for rec in read_metrics(b / "metrics.jsonl") if rec["type"] == "eval"][-1]
    assert set(ev["eval.recall_per_class"]) == {"neg", "pos"}
    assert ev["eval.recall_per_class"] == pytest.approx(sa["eval"]["recall_per_class"], abs=1e-6)


def test_lora_two_processes_equal_one(two):
    for run in equals_one_process(two["lora"]):
        assert (run / "adapter" / "adapter_model.safetensors").is_file()
        assert json.loads((run / "summary.json").read_text())["model"]["peft"]["method"] == "lora"


@pytest.mark.parametrize("packing", [True, False])
def test_sft_two_processes_accumulation_two_equals_one_process(two, packing):
    """Masked prompts (different target counts per row), packed (the default) and not; the sample prompts run
    through the chat template before training and at the evaluation."""
    a, b = equals_one_process(two["sft_packed" if packing else "sft_unpacked"])
    ea, eb = _eval(a, b)
    assert ea["tokens"] == eb["tokens"] and ea["loss"] == pytest.approx(eb["loss"], rel=1e-5)
    samples = [r for r in read_metrics(a / "metrics.jsonl") if r["type"] == "samples"]
    assert samples[0]["step"] == 0 and samples[-1]["step"] == 6  # before training, and at the evaluation
    assert samples[0]["samples"][0]["prompt"] == "what is two and two"


def test_freezing_under_fsdp_on_two_processes_leaves_the_frozen_weights_untouched(two, tiny_bert):
    """FSDP2 (fully_shard) shards frozen and trainable parameters alike: the frozen ones must come out unchanged."""
    from safetensors.torch import load_file

    run = two["freeze_fsdp"].with_suffix("") / "p2"
    assert "frozen: embeddings" in (two["freeze_fsdp"].parent / "launch.log").read_text()
    base, tuned = load_file(str(tiny_bert / "model.safetensors")), model_params(run)
    for name, value in base.items():
        key = name if name in tuned else f"bert.{name}"
        same = torch.equal(value, tuned[key])
        assert same == (name.startswith(("embeddings.", "encoder.layer.0."))), name
    summary = json.loads((run / "summary.json").read_text())
    assert summary["distributed"]["strategy"] == "fsdp" and summary["model"]["peft"]["frozen"]["embeddings"] > 0


@pytest.mark.usefixtures("own_datasets_cache")
def test_two_process_audio_run_equals_one_process(two):
    """The same engine for every modality: audio on 2 processes == 1 process x accumulation 2."""
    from safetensors.torch import load_file

    shared_data("fsdd")
    one_dir, two_dir = two["audio"].with_suffix("") / "single", two["audio"].with_suffix("") / "p2"
    one = train(two["audio"], [f"output_dir={one_dir}"])
    p2 = json.loads((two_dir / "summary.json").read_text())
    assert p2["distributed"]["world_size"] == 2 and one["train"]["accumulation_steps"] == 2
    assert p2["eval"]["samples"] == 72 and p2["eval"]["accuracy"] == one["eval"]["accuracy"]
    pa, pb = (load_file(d / "model" / "model.safetensors") for d in (one_dir, two_dir))
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], rtol=1e-4, atol=2e-5, msg=k)


def test_grpo_two_processes_log_the_global_means(two):
    """Greedy sampling: the first step's rollout metrics of 2 processes x 1 micro-batch equal one process x 2
    micro-batches' (means over both processes' completions)."""
    one_dir, two_dir = two["grpo"].with_suffix("") / "single", two["grpo"].with_suffix("") / "p2"
    one = train(two["grpo"], [f"output_dir={one_dir}"])
    assert one["train"]["accumulation_steps"] == 2
    first = [next(x for x in read_metrics(d / "metrics.jsonl") if x["type"] == "train") for d in (one_dir, two_dir)]
    for key in ("reward", "rewards/short/mean", "completions/mean_length", "frac_reward_zero_std"):
        assert first[1][key] == pytest.approx(first[0][key], rel=1e-6), key
    assert first[0]["frac_reward_zero_std"] == 1.0  # greedy: every completion of a group the same


def test_distillation_two_processes_accumulation_two_equals_one_process(two):
    """Off-policy distillation (the data's completions): each micro-batch's divergence summed over its tokens, divided
    by the step's global token count (a device scalar all-reduced), gives one process's weights and losses; the
    logged means of both models' log-probs are over both processes' tokens. The divergence of two near-equal tiny
    models (~0.005 a token) is a difference of fp32 log-probs near -5.8: its last-bit differences move it by ~2e-5
    of itself."""
    a, b = equals_one_process(two["distill"], loss_rel=1e-4)
    ea, eb = _eval(a, b)
    assert ea["tokens"] == eb["tokens"] and ea["reverse_kl"] == pytest.approx(eb["reverse_kl"], rel=1e-4)
    first = [next(x for x in read_metrics(d / "metrics.jsonl") if x["type"] == "train") for d in (a, b)]
    for key in ("kl", "student_logp", "teacher_logp", "completions/mean_length"):
        assert first[1][key] == pytest.approx(first[0][key], rel=1e-4), key


def test_a_methods_step_metrics_are_the_means_over_both_processes(two):
    """2 processes x accumulation 2: the logged step metrics are the means over both processes' rows."""
    path = two["metered"]
    single, out = path.with_suffix("") / "single", path.with_suffix("") / "p2"
    assert json.loads((out / "summary.json").read_text())["train"]["accumulation_steps"] == 2
    register_methods()
    try:
        train(path, [f"output_dir={single}"])
    finally:
        unregister_methods()
    rows = word_rows(16, 0, max_words=8, words=YES_NO)
    records = [[r for r in read_metrics(d / "metrics.jsonl") if r["type"] == "train"] for d in (single, out)]
    for a, b in zip(*records, strict=True):
        assert b["label_mean"] == pytest.approx(label_mean(out, rows), rel=1e-6)
        assert b["ce"] == pytest.approx(a["ce"], rel=1e-5) and b["ce"] == pytest.approx(b["loss"], rel=1e-5)
