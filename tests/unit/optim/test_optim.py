"""Optimizer registry, parameter groups, measured state bytes and the learning-rate schedule."""

import math
import sys

import pytest
import torch

from leantrain.config import OptimConfig
from leantrain.errors import UserError
from leantrain.optim import build_optimizer, build_scheduler, param_groups, state_bytes, state_report
from leantrain.optim.builders import muon_parameters

NAMES = ["adamw", "adafactor", "adamw8bit", "sgd", "lion", "muon"]
LR = {"adamw": 2e-3, "adafactor": 2e-3, "adamw8bit": 2e-3, "sgd": 0.1, "lion": 1e-3, "muon": 2e-3}


def tiny_classifier(vocab: int = 8192):
    """A 2-layer hidden-32 BERT classifier; the 8192 x 32 embedding is large enough for 8-bit blocks."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=2)
    return BertForSequenceClassification(cfg)


def fixed_batch(vocab: int = 8192):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, vocab, (16, 12), generator=g), torch.randint(0, 2, (16,), generator=g)


def run_steps(name: str, steps: int = 10, **keys):
    model = tiny_classifier()
    x, y = fixed_batch()
    cfg = OptimConfig(name=name, **keys)
    opt = build_optimizer(model, cfg, LR[name])
    sched = build_scheduler(opt, cfg.model_copy(update={"scheduler": "constant", "warmup_steps": 0}), steps)
    losses, report = [], None
    for _ in range(steps):
        loss = model(input_ids=x, labels=y).loss
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        report = report or state_report(opt, name)
    return model, opt, losses, report


def _needs(name: str) -> None:
    if name == "adamw8bit":
        pytest.importorskip("bitsandbytes")
    if name == "lion":
        pytest.importorskip("lion_pytorch")


@pytest.mark.parametrize("name", NAMES)
def test_each_optimizer_lowers_the_loss(name):
    _needs(name)
    _, _, losses, report = run_steps(name)
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.97 * losses[0], losses
    assert report["state_bytes"] > 0 and report["parameters"] == sum(p.numel() for p in tiny_classifier().parameters())


def test_measured_state_bytes_per_param():
    _, opt, _, adamw = run_steps("adamw", steps=1)
    n_tensors = sum(len(g["params"]) for g in opt.param_groups)
    # two fp32 moments per parameter plus one 4-byte step counter per tensor
    assert adamw["state_bytes"] == 8 * adamw["parameters"] + 4 * n_tensors
    assert round(adamw["state_bytes_per_param"], 2) == 8.0
    _, _, _, sgd = run_steps("sgd", steps=1)
    assert sgd["state_bytes"] == 4 * sgd["parameters"]  # one fp32 momentum buffer, nothing else
    _, _, _, plain = run_steps("sgd", steps=1, momentum=0.0)
    assert plain["state_bytes"] == 0
    _, _, _, ada = run_steps("adafactor", steps=1)
    assert ada["state_bytes_per_param"] < 1.0  # factored second moment, no first moment
    _, _, _, muon = run_steps("muon", steps=1)
    assert 4 < muon["state_bytes_per_param"] < 8  # one buffer on hidden matrices, two (AdamW) elsewhere


def test_adamw8bit_state_is_about_two_bytes_per_param():
    pytest.importorskip("bitsandbytes")
    _, opt, _, report = run_steps("adamw8bit", steps=1)
    assert 2.0 <= report["state_bytes_per_param"] < 2.6, report  # uint8 x 2 + block scales; small tensors stay fp32
    dtypes = {t.dtype for s in opt.state.values() for t in s.values() if torch.is_tensor(t)}
    assert torch.uint8 in dtypes


def test_state_bytes_counts_a_shared_tensor_once():
    shared = torch.zeros(256)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(5))], lr=0.1)
    for p in opt.param_groups[0]["params"]:
        opt.state[p] = {"qmap": shared, "codes": torch.zeros(p.numel(), dtype=torch.uint8)}
    assert state_bytes(opt) == 256 * 4 + 3 + 5


def test_no_decay_on_biases_and_norms_unless_asked():
    model = tiny_classifier(vocab=64)
    groups = param_groups(model, 0.1)
    decayed = {id(p) for p in groups[0]["params"]}
    assert groups[1]["weight_decay"] == 0.0
    for name, p in model.named_parameters():
        assert (id(p) in decayed) == (p.ndim >= 2), name
    assert len(param_groups(model, 0.1, decay_all=True)) == 1
    opt = build_optimizer(model, OptimConfig(name="sgd", decay_norms_and_biases=True, weight_decay=0.1), 0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1]


def test_sgd_momentum_and_nesterov_keys():
    model = tiny_classifier(vocab=64)
    g = build_optimizer(model, OptimConfig(name="sgd"), 0.1).param_groups[0]
    assert g["momentum"] == 0.9 and g["nesterov"] is False
    g = build_optimizer(model, OptimConfig(name="sgd", momentum=0.8, nesterov=True), 0.1).param_groups[0]
    assert g["momentum"] == 0.8 and g["nesterov"] is True


def test_muon_takes_hidden_matrices_adamw_the_rest():
    model = tiny_classifier(vocab=64)
    opt = build_optimizer(model, OptimConfig(name="muon"), 1e-3)
    muon, adamw = opt.optimizers
    assert type(muon).__name__ == "Muon" and type(adamw).__name__ == "AdamW"
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    assert in_muon == {id(p) for p in muon_parameters(model)}
    names = {n for n, p in model.named_parameters() if id(p) in in_muon}
    assert names and all(n.startswith("bert.") and n.endswith(".weight") and "embeddings" not in n and "LayerNorm" not in n
                         for n in names)
    assert not any(n.startswith("classifier") for n in names)
    in_adamw = [id(p) for g in adamw.param_groups for p in g["params"]]
    assert len(in_muon) + len(in_adamw) == len(list(model.parameters())) and not in_muon & set(in_adamw)
    x, y = fixed_batch(64)
    model(input_ids=x, labels=y).loss.backward()
    opt.step()
    assert set(map(id, opt.state)) == in_muon | set(in_adamw)  # reading the merged state adds nothing to a part's
    assert len(muon.state) == len(in_muon) and len(adamw.state) == len(in_adamw)


def one_step(model, opt, sched) -> None:
    x, y = fixed_batch(64)
    model(input_ids=x, labels=y).loss.backward()
    opt.step()
    sched.step()


def test_combined_optimizer_schedules_and_round_trips():
    model = tiny_classifier(vocab=64)
    cfg = OptimConfig(name="muon", scheduler="linear", warmup_steps=0)
    opt = build_optimizer(model, cfg, 1e-3)
    sched = build_scheduler(opt, cfg, 4)
    one_step(model, opt, sched)
    assert [g["lr"] for o in opt.optimizers for g in o.param_groups] == pytest.approx([0.75e-3] * len(opt.param_groups))
    fresh = build_optimizer(model, cfg, 1e-3)
    fresh.load_state_dict(opt.state_dict())
    assert state_bytes(fresh) == state_bytes(opt) > 0
    assert fresh.param_groups[0]["lr"] == pytest.approx(0.75e-3)


def test_adafactor_manual_lr_and_relative_step():
    model = tiny_classifier(vocab=64)
    opt = build_optimizer(model, OptimConfig(name="adafactor"), 1e-3)
    assert opt.param_groups[0]["relative_step"] is False and opt.param_groups[0]["lr"] == 1e-3
    cfg = OptimConfig(name="adafactor", adafactor_relative_step=True)
    opt = build_optimizer(model, cfg, 1e-3)
    sched = build_scheduler(opt, cfg, 10)
    one_step(model, opt, sched)
    assert opt.param_groups[0]["relative_step"] is True and sched.get_last_lr()[0] > 0


def test_missing_bitsandbytes_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # makes `import bitsandbytes` raise ImportError
    with pytest.raises(UserError, match=r"leantrain\[8bit\].*CUDA"):
        build_optimizer(tiny_classifier(vocab=64), OptimConfig(name="adamw8bit"), 1e-3)


@pytest.mark.parametrize("kind,expected", [
    ("linear", [2 / 3, 1.0, 0.75, 0.5, 0.25, 0.0]),
    ("cosine", [2 / 3, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]),
    ("constant", [2 / 3, 1.0, 1.0, 1.0, 1.0, 1.0]),
    ("inverse_sqrt", [2 / 3, 1.0, math.sqrt(2 / 3), math.sqrt(2 / 4), math.sqrt(2 / 5), math.sqrt(2 / 6)]),
])
def test_schedules(kind, expected):
    """Warm-up over 2 steps: steps 0, 1 at 1/3, 2/3 of the peak (the first step learns), then the schedule."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, OptimConfig(scheduler=kind, warmup_steps=2), 6)
    assert sched.get_last_lr()[0] == pytest.approx(1 / 3)  # what the first optimizer step runs at
    seen = []
    for _ in range(6):
        opt.step()
        sched.step()
        seen.append(sched.get_last_lr()[0])
    assert seen == pytest.approx(expected)


@pytest.mark.parametrize("kind", ["linear", "cosine", "constant", "inverse_sqrt"])
@pytest.mark.parametrize("warmup,total", [(0, 7), (3, 10), (0, 300), (30, 300)])
def test_schedules_equal_transformers_definitions(kind, warmup, total):
    """After the warm-up (and at every step without one) the rate is bitwise what transformers' get_scheduler gives
    the Trainer for the same settings (issue 37: vs_trainer_lm compares the two at equal recipe; a schedule equal only
    up to rounding, e.g. linear as 1 - progress, drifts the runs apart)."""
    from transformers import get_scheduler

    def lrs(sched, opt):
        seen = [sched.get_last_lr()[0]]
        for _ in range(total + 2):
            opt.step()
            sched.step()
            seen.append(sched.get_last_lr()[0])
        return seen

    ours_opt, theirs_opt = (torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0) for _ in range(2))
    ours = build_scheduler(ours_opt, OptimConfig(scheduler=kind, warmup_steps=warmup), total)
    name = {"constant": "constant_with_warmup"}.get(kind, kind)
    extra = {"scheduler_specific_kwargs": {"timescale": max(warmup, 1)}} if kind == "inverse_sqrt" else \
        {"num_training_steps": total}
    theirs = get_scheduler(name, theirs_opt, num_warmup_steps=warmup, **extra)
    ours, theirs = lrs(ours, ours_opt), lrs(theirs, theirs_opt)
    assert ours[warmup:] == theirs[warmup:]  # after warm-up: transformers' shapes, to the bit
    assert ours[:warmup] == pytest.approx([(s + 1) / (warmup + 1) for s in range(warmup)])  # step 0 learns


def test_warmup_ratio_rounds_up():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, OptimConfig(scheduler="constant", warmup_ratio=0.1), 25)  # ceil(2.5) = 3 steps
    opt.step()
    sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(2 / 4)  # step 1 of a 3-step warm-up: (1 + 1) / (3 + 1)


def test_lr_steps_once_per_optimizer_step_under_accumulation(tmp_path, tiny_bert):
    """batch 16 = micro 4 x accumulation 4: the logged lr follows the optimizer step, not the micro-batch."""
    import json

    from leantrain import train
    from leantrain.report.logs import read_metrics
    from tests.helpers import alternating_rows, write_rows

    data = write_rows(tmp_path / "train.csv", alternating_rows(96))
    out = tmp_path / "run"
    summary = train(None, [f"model.name={tiny_bert}", f"data.train={data}", "train.batch_size=16",
                           "train.micro_batch_size=4", "train.max_steps=6", "train.lr=1e-3", "optim.warmup_steps=2",
                           "optim.scheduler=linear", "train.log_every_steps=1", f"output_dir={out}",
                           "report.plots=false"])
    assert summary["train"]["accumulation_steps"] == 4
    lrs = [r["lr"] for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"]
    assert lrs == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3, 7.5e-4, 5e-4, 2.5e-4])  # the rate each step applied
    optim = json.loads((out / "summary.json").read_text())["optim"]
    assert optim["name"] == "adamw" and optim["class"] == "AdamW"
    assert optim["parameters"] == summary["model"]["parameters"]["trainable"]
    assert round(optim["state_bytes_per_param"], 2) == 8.0 and optim["state_bytes"] > 8 * optim["parameters"]


def test_one_step_run_trains_at_a_nonzero_lr():
    """train.max_steps=1 with the default warm-up ratio (ceil(0.06) = 1 warm-up step) still moves the weights."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, OptimConfig(), 1)
    assert sched.get_last_lr()[0] == pytest.approx(0.5)


def test_adapters_default_to_a_larger_lr_unless_set():
    from leantrain.config import resolve
    from leantrain.config.training import ADAPTER_LR

    assert resolve(None, []).train.lr == 5e-5
    assert resolve(None, ["peft.method=lora"]).train.lr == ADAPTER_LR == 2e-4
    assert resolve(None, ["peft.method=lora", "train.lr=1e-5"]).train.lr == 1e-5
    assert resolve(resolve(None, ["peft.method=lora"]).to_dict()).train.lr == ADAPTER_LR  # a saved config.yaml
