"""efficiency.chunked_loss=auto: the choice of the output layer's loss per device (every branch of the pure decision),
the auto path on a model (the chosen computation equals the plain one), and Liger's fused kernel on CUDA (gpu)."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch

from leantrain.modeling.chunked_loss import apply_chunked_loss, is_installed
from leantrain.modeling.output_loss import PLAIN_SHARE, choose_output_loss, plain_logits_bytes
from tests.tiny_models import assert_close, loss_batch, loss_llama, losses_and_grads

GIB = 2**30


def test_choose_output_loss_every_branch():
    assert choose_output_loss("cpu", True, 1, 100 * GIB)[0] == "chunked"  # CPU: chunked, whatever is installed
    assert choose_output_loss("mps", False, None, None)[0] == "chunked"
    choice, why = choose_output_loss("cuda", True, 50 * GIB, GIB)
    assert choice == "liger" and "liger_kernel" in why
    choice, why = choose_output_loss("cuda", False, int(PLAIN_SHARE * 80 * GIB), 80 * GIB)
    assert choice == "plain" and "fit 25% of the budget" in why
    choice, why = choose_output_loss("cuda", False, int(PLAIN_SHARE * 80 * GIB) + 1, 80 * GIB)
    assert choice == "chunked" and "exceed" in why and "pip install leantrain[liger]" not in why
    choice, why = choose_output_loss("cuda", False, None, 80 * GIB)
    assert choice == "chunked" and "train.micro_batch_size=auto" in why


def test_auto_does_not_choose_liger_for_a_task_whose_token_gradients_differ(monkeypatch):
    """The preference losses give a pair's tokens different incoming gradients (Liger's reduction='none' gradient
    would be wrong, and its guard stops the run): auto knows the task and picks the plain or the chunked loss."""
    from leantrain.modeling.chunked_loss import chunked_layer
    from leantrain.methods import get_task

    assert get_task("causal-lm").traits.uniform_token_gradients
    assert not get_task("preference").traits.uniform_token_gradients
    choice, why = choose_output_loss("cuda", True, None, 80 * GIB, uniform=False)
    assert choice == "chunked" and "weighs tokens differently" in why and "pip install" not in why
    assert choose_output_loss("cuda", True, GIB, 80 * GIB, uniform=False)[0] == "plain"
    assert choose_output_loss("cuda", True, GIB, 80 * GIB, uniform=True)[0] == "liger"
    monkeypatch.setattr("leantrain.modeling.chunked_loss.liger_available", lambda: True)  # as on CUDA with liger
    model = loss_llama(vocab=8192)
    note = apply_chunked_loss(model, "auto", "cuda", None, None,
                              uniform=get_task("preference").traits.uniform_token_gradients)
    assert note.startswith("chunked loss: on (auto: this task's loss weighs tokens differently")
    assert chunked_layer(model).leantrain_loss_kernel == "chunked"


def test_plain_logits_bytes_counts_the_gradient_too():
    assert plain_logits_bytes(16 * 512, 50_000) == 16 * 512 * 50_000 * 8  # 3.05 GiB: fp32 logits + their gradient


@pytest.mark.parametrize("device, logits, chosen", [("cpu", None, "chunked"), ("cuda", GIB, "plain"),
                                                    ("cuda", 100 * GIB, "chunked")])
def test_auto_on_a_model_logs_why_and_its_loss_equals_the_plain_one(device, logits, chosen, monkeypatch):
    monkeypatch.setattr("leantrain.modeling.chunked_loss.liger_available", lambda: False)  # not installed here
    plain = loss_llama(vocab=8192)
    model = copy.deepcopy(plain)
    note = apply_chunked_loss(model, "auto", device, logits, 80 * GIB if logits else None)  # no CUDA run here
    assert is_installed(model) == (chosen == "chunked")
    assert ("chunked loss: on (auto:" in note) if chosen == "chunked" else note.startswith("output loss: plain")
    ids, labels, weights = loss_batch()
    loss_p, grads_p = losses_and_grads(plain, ids, labels, weights, chunked=False)
    loss_a, grads_a = losses_and_grads(model, ids, labels, weights, chunked=True)
    assert_close(loss_a, loss_p, "per-token losses")
    for name in grads_p:
        assert_close(grads_a[name], grads_p[name], name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("liger_kernel") is None,
                    reason="needs a CUDA device and liger-kernel (pip install leantrain[liger])")
def test_liger_loss_and_gradients_equal_the_plain_computation():
    plain = loss_llama(vocab=8192).cuda()
    fused = copy.deepcopy(plain)
    assert apply_chunked_loss(fused, "auto", "cuda", None, None).startswith("output loss: Liger")
    ids, labels, _ = loss_batch()
    ids, labels = ids.cuda(), labels.cuda()
    uniform = torch.full((3, 10), 0.7, device="cuda")  # the engine's gradient: a row's loss_weight on each token
    loss_p, grads_p = losses_and_grads(plain, ids, labels, uniform, chunked=False)
    loss_l, grads_l = losses_and_grads(fused, ids, labels, uniform, chunked=True)
    assert_close(loss_l, loss_p, "per-token losses")
    assert grads_l.keys() == grads_p.keys()
    for name in grads_p:
        assert_close(grads_l[name], grads_p[name], name)
    with pytest.raises(RuntimeError, match="set efficiency.chunked_loss=true"):  # older Liger would get these wrong
        losses_and_grads(fused, ids, labels, torch.rand(3, 10, device="cuda") + 0.5, chunked=True)
    # the task's loss with a row of weight 0 (it keeps processes in step): its targets are masked, so Liger's
    # gradient is uniform over the tokens with a target and equals the plain one
    from leantrain.methods import get_task

    task, batch_ = get_task("causal-lm"), {"input_ids": ids, "labels": labels,
                                           "loss_weight": torch.tensor([1.0, 0.0, 1.0], device="cuda")}
    for model in (plain, fused):
        model.zero_grad(set_to_none=True)
        task.step.forward_loss(model, batch_)[0].backward()
    for (name, p), q in zip(fused.named_parameters(), plain.parameters()):
        assert_close(p.grad, q.grad, name)


def test_the_sizes_auto_decides_from():
    from leantrain.config import resolve
    from leantrain.engine.devices.efficiency import output_loss_sizes

    model, cuda = loss_llama(vocab=8192), torch.device("cuda")  # a device object only: nothing runs on it
    eff = resolve(None, ["efficiency.memory_budget=8GiB"]).efficiency
    assert output_loss_sizes(model, eff, cuda, 4, 512) == (plain_logits_bytes(4 * 512, 8192), 8 * GIB)
    assert output_loss_sizes(model, eff, cuda, "auto", 512) == (None, 8 * GIB)  # the micro-batch is not known yet
    assert output_loss_sizes(model, eff, torch.device("cpu"), 4, 512) == (None, None)  # CPU: chunked, no sizes
