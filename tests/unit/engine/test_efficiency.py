"""Efficiency switches change how a step is computed, never what it computes: each is checked against the plain run."""

import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import gradients, switched, text_batch, word_rows, write_rows
from tests.tiny_models import loss_llama, tiny_bert_classifier
from leantrain import train
from leantrain.config import resolve
from leantrain.engine.devices.batch_layout import batch_layout
from leantrain.errors import ConfigError
from leantrain.methods import TEXT, get_task


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eff-data")  # 1 to 30 words: uneven lengths, 3 to 32 tokens
    return write_rows(tmp / "train.csv", word_rows(96)), write_rows(tmp / "dev.csv", word_rows(16, seed=1))


def run(tmp_path, tiny_bert, data, name, *overrides):
    out = tmp_path / name
    summary = train(None, [f"model.name={tiny_bert}", f"data.train={data[0]}", f"data.eval={data[1]}",
                           "train.epochs=1", "train.batch_size=32", "train.lr=1e-3", "report.plots=false",
                           "efficiency.precision=fp32", f"output_dir={out}", *overrides])
    return summary, load_file(out / "model" / "model.safetensors")


def assert_same_params(a, b, rtol=1e-5, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=k)


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tiny_bert, data):
    return run(tmp_path_factory.mktemp("plain"), tiny_bert, data, "plain", "train.micro_batch_size=32")


def test_accumulation_run_equals_one_big_batch(tmp_path, tiny_bert, data, plain):
    summary, params = run(tmp_path, tiny_bert, data, "acc", "train.micro_batch_size=8")
    assert summary["train"]["accumulation_steps"] == 4 and plain[0]["train"]["accumulation_steps"] == 1
    assert summary["train"]["steps"] == 3
    assert_same_params(params, plain[1])


def test_the_runs_do_train(tiny_bert, plain):
    from transformers import AutoModel

    base = AutoModel.from_pretrained(tiny_bert).state_dict()
    moved = [k for k, v in base.items() if f"bert.{k}" in plain[1] and not torch.equal(v, plain[1][f"bert.{k}"])]
    assert len(moved) > 10  # the equivalence above is not two untouched models


def test_micro_batch_that_does_not_divide_says_what_would():
    cfg = resolve(None, ["train.batch_size=48", "train.micro_batch_size=16"])  # 24 per process over 2
    with pytest.raises(ConfigError, match=r"use train.micro_batch_size=12, or train.batch_size=64"):
        batch_layout(cfg, 100, world_size=2)


# ------------------------------------------------------------------------------------------ gradient checkpointing


def test_gradient_checkpointing_gives_the_same_gradients(tiny_bert):
    from transformers import AutoModelForSequenceClassification

    from leantrain.config import EfficiencyConfig

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2).train()
    batch = text_batch()
    plain = gradients(model, batch)
    paths = switched(model, EfficiencyConfig(gradient_checkpointing=True))
    assert model.is_gradient_checkpointing and "checkpointing: on" in paths["gradient_checkpointing"].line
    ckpt = gradients(model, batch)
    assert ckpt.keys() == plain.keys() and len(plain) > 20
    for k in plain:
        torch.testing.assert_close(ckpt[k], plain[k], rtol=1e-5, atol=1e-7, msg=k)


# ------------------------------------------------------------------------------------------------ mixed precision


def test_loss_is_fp32_under_bf16_autocast(tiny_bert):
    from transformers import AutoModelForSequenceClassification

    from leantrain.methods import model_inputs
    from leantrain.methods.classify.classification import per_example_loss

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)
    batch = text_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(**model_inputs(batch)).logits
        assert logits.dtype == torch.bfloat16  # the autocast is real ...
        assert per_example_loss(logits, batch["labels"]).dtype == torch.float32  # ... and the loss is not in it
        assert get_task(TEXT).step.forward_loss(model, batch)[0].dtype == torch.float32


def test_precision_choice_on_cpu():
    from leantrain.engine.devices.efficiency import cpu_has_native_bf16, resolve_precision

    assert resolve_precision("fp32", "cpu")[0] == "fp32" and resolve_precision("bf16", "cpu")[0] == "bf16"
    choice, why = resolve_precision("auto", "cpu")
    assert choice == ("bf16" if cpu_has_native_bf16() else "fp32") and why


@pytest.mark.parametrize("precision", ["fp16", "fp8"])
def test_fp16_and_fp8_refused_on_cpu_with_exit_2(precision, tmp_path, capsys):
    from leantrain.cli import main

    assert main(["train", f"efficiency.precision={precision}", f"output_dir={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert f"efficiency.precision={precision} is not supported on cpu" in err and "bf16" in err
    assert not (tmp_path / "o").exists()


def test_bf16_run_trains_and_says_so(tmp_path, tiny_bert, data, plain):
    summary, params = run(tmp_path, tiny_bert, data, "bf16", "efficiency.precision=bf16")
    assert summary["efficiency"]["precision"] == "bf16"
    diff = max((params[k] - plain[1][k]).abs().max().item() for k in params)
    assert 0 < diff < 0.05  # bf16 differs from fp32 (it really ran in bf16), but only by rounding


# ------------------------------------------------------------------------------------------------ MFU, time split


def test_summary_has_mfu_and_time_split(plain):
    t, n = plain[0]["train"], plain[0]["model"]["parameters"]["non_embedding"]
    assert 15_000 < n < 25_000  # 2 layers x (4 x 32^2 + 2 x 32 x 64) weights + biases, pooler, head
    assert 6 * n + 12 * 2 * 32 * 3 < t["flops_per_token"] < 6 * n + 12 * 2 * 32 * 34  # attention at 3..34 tokens
    assert t["peak_flops"] > 1e8 and 0 < t["mfu"] < 1
    assert t["mfu"] == pytest.approx(t["flops_per_token"] * t["tokens_per_second"] / t["peak_flops"])
    split = t["time_split_seconds"]
    assert set(split) == {"data", "compute", "optimizer"} and all(v > 0 for v in split.values())
    assert sum(split.values()) <= t["loop_seconds"] * 1.01


def test_summary_says_which_cpu_fast_paths_ran(plain):
    eff = plain[0]["efficiency"]
    assert eff["dropout"] == "auto" and eff["dropout_applied"] == "fast"  # auto: fast on CPU
    assert eff["cpu_allocator_applied"] == ("reuse" if sys.platform.startswith("linux") else "system")


# ------------------------------------------------------------------------------------------------ auto micro-batch


@pytest.fixture(scope="module")
def classifier(tiny_bert):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=2)


def test_planner_lines_and_measured_activations(classifier):
    from leantrain.perf import memory_model

    cal = memory_model.calibrate(classifier, 34, "fp32", False, per_process=8, task=get_task(TEXT))
    assert cal.sizes[0] == 1 and 2 <= cal.sizes[1] <= 8 and cal.saved_at(16) > cal.saved_at(8) > 0
    facts = memory_model.model_facts(classifier, framework_bytes=100 * 2**20)
    lines = memory_model.lines(facts, cal, 8, state_bytes=123)
    n = sum(p.numel() for p in classifier.parameters())
    assert lines["parameters"] == lines["gradients"] == 4 * n and lines["optimizer_state"] == 123
    assert lines["framework_overhead"] >= 100 * 2**20 and lines["activations"] == cal.saved_at(8)
    assert lines["total"] == sum(v for k, v in lines.items() if k != "total")
    ckpt = memory_model.calibrate(classifier, 34, "fp32", True, per_process=8, task=get_task(TEXT))
    assert not memory_model.is_checkpointing(classifier)  # calibration leaves the model as it was
    per_example = lambda c: (c.saved[1] - c.saved[0]) / (c.sizes[1] - c.sizes[0])  # noqa: E731
    assert per_example(ckpt) < per_example(cal) / 2  # checkpointing keeps layer inputs only


def test_planner_picks_the_largest_divisor_that_fits(classifier):
    from leantrain.errors import UserError
    from leantrain.perf import memory_model
    from leantrain.perf.auto_micro_batch import need_bytes, fit_micro_batch

    cfg = resolve(None, [])
    cal = memory_model.calibrate(classifier, 34, "fp32", False, per_process=24, task=get_task(TEXT))
    facts = memory_model.model_facts(classifier, framework_bytes=50 * 2**20)
    state = memory_model.meta_state_bytes(classifier, cfg.optim)
    need = {m: need_bytes(memory_model.lines(facts, cal, m, state)) for m in (1, 4, 6, 8)}
    assert need[1] < need[4] < need[6] < need[8]
    pick = lambda budget: fit_micro_batch(cfg, classifier, get_task(TEXT), 24, 34, budget, calibration=cal, facts=facts)[0]  # noqa: E731
    assert pick(need[4] + 1) == 4  # 6 does not fit, 5 does not divide
    assert pick(10**12) == 24
    with pytest.raises(UserError, match="even a micro-batch of 1.*efficiency.memory_budget"):
        pick(need[1] - 1)


def test_auto_micro_batch_run_equals_plain_run(tmp_path, tiny_bert, data, plain):
    # The choice under a tight budget is tested above with a fixed calibration; here the run's own planning
    # (measured in this process) must let the whole batch through under a generous budget and train the same.
    summary, params = run(tmp_path, tiny_bert, data, "auto", "train.micro_batch_size=auto",
                          "efficiency.memory_budget=1TiB")
    assert summary["train"]["micro_batch_size"] == 32 and summary["train"]["accumulation_steps"] == 1
    assert_same_params(params, plain[1])


def test_memory_budget_parsing():
    from leantrain.perf.auto_micro_batch import parse_bytes

    assert parse_bytes("4GiB") == 4 * 2**30 and parse_bytes("500MB") == 500_000_000 and parse_bytes(123) == 123
    with pytest.raises(ConfigError, match="efficiency.memory_budget"):
        parse_bytes("lots")


# --------------------------------------------------------------------------------- compile and attention choices


def test_choose_compile_every_branch():
    from leantrain.engine.devices.efficiency import choose_compile

    assert choose_compile(True, "cpu", False, "auto") == (True, "as configured (efficiency.compile)")
    assert choose_compile(False, "cuda", True, "auto")[0] is False
    for args, why in [(("cpu", True, "auto"), "no gain on the CPU"), (("mps", True, "ddp"), "not measured on mps"),
                      (("cuda", True, "deepspeed"), "DeepSpeed's ZeRO hooks"),
                      (("cuda", False, "auto"), "only causal-LM training"),
                      (("cuda", True, "ddp"), "not measured on CUDA yet")]:  # no measured gain anywhere: off
        compiled, reason = choose_compile("auto", *args)
        assert compiled is False and reason.startswith("auto: ") and why in reason, args


def test_a_cpu_run_resolves_to_sdpa_and_no_compile_and_says_why(plain):
    eff = plain[0]["efficiency"]
    assert eff["compile"] == "auto" and eff["compile_applied"] is False and eff["compile_seconds"] is None
    assert "no gain on the CPU" in eff["compile_reason"]
    assert eff["attn_implementation"] == "sdpa" and eff["attn_implementation_reason"].startswith("auto: PyTorch SDPA")


def test_an_attention_the_device_cannot_run_exits_before_the_model_loads(tmp_path, tiny_bert, data, monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the model was built")

    monkeypatch.setattr("leantrain.engine.training.loop.build_model", no_model)
    with pytest.raises(ConfigError, match="model.attn_implementation=flash_attention_2: flash attention runs on CUDA"):
        run(tmp_path, tiny_bert, data, "flash", "model.attn_implementation=flash_attention_2")


# ------------------------------------------------------------------------------------------------ compile


@pytest.mark.slow
def test_compiled_run_gives_the_eager_loss(tmp_path, tiny_bert, data):
    """torch.compile on a tiny model: two steps at one padded shape (one compilation), loss as in eager."""
    args = ["train.max_steps=2", "data.batching=padded", "data.max_length=32", "train.log_every_steps=1"]
    eager, _ = run(tmp_path, tiny_bert, data, "eager", *args)
    compiled, _ = run(tmp_path, tiny_bert, data, "compiled", *args, "efficiency.compile=true")
    assert compiled["efficiency"]["compile"] is True and compiled["efficiency"]["compile_seconds"] > 0
    assert compiled["train"]["final_loss"] == pytest.approx(eager["train"]["final_loss"], rel=1e-4)


@pytest.mark.parametrize("requested,device,precision,strategy,compiled,ckpt,on", [
    ("auto", "cpu", "bf16", "auto", False, False, True),
    ("auto", "cuda", "bf16", "auto", False, False, False),  # not measured on GPUs
    (True, "cuda", "bf16", "ddp", False, False, True),
    ("auto", "cpu", "fp32", "auto", False, False, False),  # no autocast cast to remake
    (True, "cpu", "bf16", "fsdp", False, False, False),  # FSDP frees the gathered weights after the forward
    (True, "cpu", "bf16", "auto", True, False, False),
    (True, "cpu", "bf16", "auto", False, True, False),
    (False, "cpu", "bf16", "auto", False, False, False),
])
def test_choose_recast(requested, device, precision, strategy, compiled, ckpt, on):
    from leantrain.engine.devices.efficiency import choose_recast

    chosen, why = choose_recast(requested, device, precision, strategy, compiled, ckpt)
    assert chosen is on and why


def test_the_resolved_recast_swaps_the_bias_free_linears_or_says_there_are_none():
    from leantrain.engine.devices.efficiency import ModelChoices

    choices = ModelChoices(None, "", False, "", True, "auto: on for CPU training")
    casts = lambda model, c=choices: switched(model, choices=c)["weight_casts"]  # noqa: E731
    llama, bert = casts(loss_llama()), casts(tiny_bert_classifier())
    assert "in 15 linear layers" in llama.line and llama.value is True
    assert "no bias-free linear layer" in bert.line and bert.value is False
    assert "kept for the backward (off)" in casts(loss_llama(), ModelChoices(None, "", False, "", False, "off")).line


@pytest.mark.parametrize("device, chosen", [("cpu", "chunked loss: on"), ("cuda", "output loss: plain")])
def test_plan_installs_the_output_loss_train_would_on_its_device(device, chosen, monkeypatch):
    """leantrain plan prices what train installs: the device's choice (a CUDA run whose logits fit its budget keeps
    the plain logits; a CPU run chunks), from the micro-batch's logits and the budget, not the CPU's by default."""
    from leantrain.config.run_options import EfficiencyConfig
    from leantrain.engine.devices.efficiency import install_output_loss
    from leantrain.modeling.chunked_loss import is_installed
    from tests.tiny_models import loss_llama

    monkeypatch.setattr("leantrain.modeling.chunked_loss.liger_available", lambda: False)
    model = loss_llama(vocab=8192)  # stays on the CPU: only the device's type is read
    eff = EfficiencyConfig(memory_budget="80GiB")
    note = install_output_loss(model, eff, torch.device(device), 4, 64, uniform=True)
    assert note.startswith(chosen) and is_installed(model) == (device == "cpu")
