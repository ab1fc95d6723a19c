"""The CPU step's fast paths compute what the plain code computes: fast dropout (same distribution, exact
expectation, gradient through the same mask), the clip folded into the fused AdamW kernel (same update up to
rounding), host memory reuse (the same buffers, without page faults)."""

import copy
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from leantrain.engine.devices.dropout import FastDropout, keep_mask, quantized_p, resolve_dropout, use_fast_dropout
from leantrain.config import resolve
from tests.helpers import gradients, make_tiny_bert, switched, text_batch

# ------------------------------------------------------------------------------------------------ dropout


def test_quantized_p_is_within_half_a_level():
    for p in (0.0, 0.05, 0.1, 0.3, 0.5, 0.9):
        assert abs(quantized_p(p) - p) <= 0.5 / 65536
    assert quantized_p(0.1) == 6554 / 65536


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_fast_dropout_drops_at_rate_p_and_keeps_the_expectation(p):
    torch.manual_seed(0)
    n = 1_000_000
    out = FastDropout(p).train()(torch.ones(n))
    dropped = float((out == 0).float().mean())
    assert abs(dropped - p) < 5 * (p * (1 - p) / n) ** 0.5  # five standard deviations
    kept = out[out != 0]
    assert torch.all(kept == 1.0 / (1.0 - quantized_p(p)))  # scaled by the inverse of the applied rate
    assert abs(float(out.mean()) - 1.0) < 5 * (p / (1 - p) / n) ** 0.5


def test_fast_dropout_masks_are_uncorrelated_between_neighbours():
    """Four elements share one 64-bit draw: their masks must still be independent."""
    torch.manual_seed(1)
    keep = keep_mask(torch.Size([400_000]), 0.5, torch.device("cpu")).float().view(-1, 4)
    corr = np.corrcoef(keep.T.numpy())
    assert np.abs(corr - np.eye(4)).max() < 0.01


def test_fast_dropout_gradient_goes_through_the_same_mask():
    torch.manual_seed(0)
    x = (torch.rand(64, 33) + 0.5).requires_grad_()  # positive: an output of 0 means dropped
    g = torch.randn(64, 33)
    drop = FastDropout(0.2).train()
    out = drop(x)
    out.backward(g)
    scale = 1.0 / (1.0 - quantized_p(0.2))
    torch.testing.assert_close(out, torch.where(out != 0, x.detach() * scale, 0))
    torch.testing.assert_close(x.grad, torch.where(out != 0, g * scale, 0))


def test_fast_dropout_is_seeded_keeps_dtype_and_is_identity_in_eval():
    x = torch.randn(8, 16, 32, dtype=torch.bfloat16)
    drop = FastDropout(0.1).train()
    torch.manual_seed(3)
    a = drop(x)
    torch.manual_seed(3)
    b = drop(x)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)
    assert not torch.equal(a, drop(x))  # the generator moved on
    assert drop.eval()(x) is x and FastDropout(0.0).train()(x) is x
    assert torch.equal(FastDropout(1.0).train()(x), torch.zeros_like(x))


def test_swapping_keeps_the_model_and_its_outputs(tiny_bert_dropout):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dropout, num_labels=2).eval()
    ids = torch.randint(1000, 2000, (3, 9))
    before, keys = model(input_ids=ids).logits, set(model.state_dict())
    n_dropout = sum(type(m) is nn.Dropout for m in model.modules())
    assert use_fast_dropout(model) == n_dropout > 0
    assert not any(type(m) is nn.Dropout for m in model.modules())
    assert all(m.p == 0.1 for m in model.modules() if isinstance(m, FastDropout))
    assert set(model.state_dict()) == keys
    torch.testing.assert_close(model(input_ids=ids).logits, before)  # eval: identity


def test_dropout_switched_off_is_not_reported_fast(tiny_bert_dropout):
    """preference.dropout=off sets every p to 0 before the switches: no module is swapped and no "dropout: fast"
    line follows the "dropout: off" one (it said "fast (N nn.Dropout modules ...)" for the same N)."""
    from transformers import AutoModelForSequenceClassification

    from leantrain.engine.devices.dropout import disable_dropout

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dropout, num_labels=2).train()
    assert disable_dropout(model) > 0
    paths = switched(model)
    assert not [n for n in paths.lines() if "dropout" in n], paths.lines()
    assert not any(isinstance(m, FastDropout) for m in model.modules())


def test_the_method_that_switches_dropout_off_is_not_reported_fast(tiny_bert_dropout):
    """preference.dropout=off (the reward model's traits): every dropout at p = 0, said once, nothing swapped."""
    from transformers import AutoModelForSequenceClassification

    from leantrain.methods import get_task

    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dropout, num_labels=2).train()
    traits = get_task("reward-model").configured(resolve(None, ["model.task=reward-model"])).traits
    paths = switched(model, traits=traits)
    assert paths["dropout"].value == "off" and paths["dropout"].line.startswith("dropout: off in ")
    assert all(m.p == 0 for m in model.modules() if isinstance(m, nn.Dropout))
    assert not any(isinstance(m, FastDropout) for m in model.modules())


def test_checkpointing_recomputes_the_same_fast_dropout_masks(tiny_bert_dropout):
    """Recomputed forward passes (gradient checkpointing) draw the same masks: torch restores the generator."""
    from transformers import AutoModelForSequenceClassification

    from leantrain.config import EfficiencyConfig

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert_dropout, num_labels=2).train()
    assert switched(model)["dropout"].line.startswith("dropout: fast")
    batch = text_batch()
    grads = {}
    for name, seed in (("plain", 1), ("again", 1), ("other", 2)):
        torch.manual_seed(seed)
        grads[name] = gradients(model, batch)
    switched(model, EfficiencyConfig(gradient_checkpointing=True))
    torch.manual_seed(1)
    grads["checkpointed"] = gradients(model, batch)
    for k, g in grads["plain"].items():
        assert torch.equal(grads["again"][k], g), k
        torch.testing.assert_close(grads["checkpointed"][k], g, rtol=1e-5, atol=1e-7, msg=k)
    assert any(not torch.equal(grads["other"][k], g) for k, g in grads["plain"].items())


def test_dropout_auto_is_fast_on_cpu_only():
    assert resolve_dropout("auto", "cpu") == "fast" and resolve_dropout("auto", "cuda") == "torch"
    assert resolve_dropout("torch", "cpu") == "torch"


@pytest.fixture(scope="module")
def tiny_bert_dropout(tmp_path_factory):
    return make_tiny_bert(tmp_path_factory.mktemp("bert-dropout"), dropout=0.1)


# --------------------------------------------------------------------------------------- clip in the kernel


def _steps(accelerator, model, rows, clip, max_norm, steps=4):
    from leantrain.engine.devices.distributed import clip_gradients

    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01, fused=True)
    norms = []
    for _ in range(steps):
        model(**rows).loss.backward()
        if clip == "folded":
            norms.append(clip_gradients(model, accelerator, max_norm, opt))
        else:
            norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, torch.stack(norms)


@pytest.fixture(scope="module")
def clip_setup(tiny_bert):
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_bert, num_labels=3).train()
    rows = {"input_ids": torch.randint(1000, 2000, (6, 12)), "labels": torch.tensor([0, 1, 2, 0, 1, 2])}
    return Accelerator(cpu=True), model, rows


@pytest.mark.parametrize("max_norm", [0.05, 1e6])  # clipping every step / never
def test_clip_folded_into_fused_adamw_equals_clip_grad_norm(clip_setup, max_norm):
    accelerator, model, rows = clip_setup
    plain, plain_norms = _steps(accelerator, model, rows, "plain", max_norm)
    folded, folded_norms = _steps(accelerator, model, rows, "folded", max_norm)
    torch.testing.assert_close(folded_norms, plain_norms, rtol=1e-5, atol=0)
    assert float(plain_norms.min()) > 0.05 or max_norm > 1  # the small max_norm really clips
    for (name, a), b in zip(folded.named_parameters(), plain.parameters()):
        if max_norm > 1:
            assert torch.equal(a, b), name  # grad / 1.0 is exact: bitwise the same run
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


# ------------------------------------------------------------------------------------------- host memory

FAULTS = """
import resource, torch
from leantrain.engine.devices.host_allocator import host_memory

def faults_of_a_fresh_64mb_buffer():
    for _ in range(12):  # a training step's pattern: a big buffer and small tensors, allocated, touched, freed
        big, small = torch.empty(16 * 2**20).fill_(1.0), torch.randn(1000)
        del big, small
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(16 * 2**20).fill_(2.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20

with host_memory("{mode}") as applied:
    inside = faults_of_a_fresh_64mb_buffer()
    rss_inside = rss_mb()
print(applied, inside, rss_inside, rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_reused_host_memory_is_not_page_faulted_again_and_is_handed_back_at_the_end():
    pages = 64 * 2**20 // 4096
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = {}
    for mode in ("reuse", "system"):
        res = subprocess.run([sys.executable, "-c", textwrap.dedent(FAULTS.format(mode=mode))], capture_output=True,
                             text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stderr
        applied, *numbers = res.stdout.split()
        out[mode] = (applied, *map(int, numbers))
    assert out["reuse"][0] == "reuse" and out["system"][0] == "system"
    assert out["reuse"][1] < pages // 10  # the freed 64 MB came back from the heap, already mapped
    assert out["system"][1] > pages // 2  # glibc's default: a fresh mmap, every page faulted in again
    rss_inside, rss_after = out["reuse"][2:]
    assert rss_after < rss_inside - 64  # at the end of the block the kept memory is handed back (trimmed)
