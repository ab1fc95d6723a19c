"""The one call of a causal LM's per-token losses (leantrain.modeling.token_losses): through the installed output loss
it gives the plain computation's losses (minus the targets' log-probs), entropy and gradients, next-token or aligned
targets;
the forward's autocast dtype reaches the kernel run after it; nothing stays on a module after a forward; a compiled
model and Liger's kernel (a CPU stand-in) go through the same call."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from leantrain.modeling.chunked_loss import Capture, final_hidden, install_chunked_loss
from leantrain.modeling.token_losses import token_losses
from tests.tiny_models import assert_close, loss_batch, loss_llama


def run(model, ids, labels, weights, **kw):
    """(losses, entropy, gradients of the weighted losses' sum) of ``token_losses`` on ``model``."""
    model.zero_grad(set_to_none=True)
    out = token_losses(model, lambda: model(input_ids=ids), labels, **kw)
    (out.losses * weights[:, :out.losses.shape[1]]).sum().backward()
    return out.losses.detach(), out.entropy, {n: p.grad.clone() for n, p in model.named_parameters()
                                              if p.grad is not None}


@pytest.mark.parametrize("next_token", [True, False])
@pytest.mark.parametrize("tied", [True, False])
def test_the_installed_loss_gives_the_plain_losses_log_probs_and_gradients(next_token, tied):
    plain = loss_llama(tied)
    chunked = copy.deepcopy(plain)
    assert install_chunked_loss(chunked, chunk_tokens=4)
    ids, labels, weights = loss_batch()
    if not next_token:  # aligned targets: position i predicts targets[:, i] (the last position none)
        labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
        weights = torch.cat([weights, weights[:, :1]], dim=1)
    loss_p, spread_p, grads_p = run(plain, ids, labels, weights, next_token=next_token, entropy=True)
    loss_c, spread_c, grads_c = run(chunked, ids, labels, weights, next_token=next_token, entropy=True)
    assert loss_c.shape == loss_p.shape == ((3, 10) if next_token else (3, 11)) and loss_c.dtype == torch.float32
    assert_close(loss_c, loss_p, "per-token losses")
    with torch.no_grad():  # the losses are minus the targets' log-probs, 0 where there is no target
        logits = plain(input_ids=ids).logits
        logp = (logits[:, :-1] if next_token else logits).float().log_softmax(-1)
        targets = labels[:, 1:] if next_token else labels
        picked = logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    assert_close(-loss_c, torch.where(targets == -100, 0.0, picked), "log-probs")
    assert_close(spread_p, -(logp.exp() * logp).sum(-1), "entropy (plain)")
    assert_close(spread_c, spread_p, "entropy")
    assert not spread_c.requires_grad
    assert grads_c.keys() == grads_p.keys() and ("lm_head.weight" in grads_c or tied)
    for name in grads_p:
        assert_close(grads_c[name], grads_p[name], name)


def test_the_forwards_autocast_dtype_reaches_the_kernel_run_after_it():
    """Accelerate's autocast wraps the model's forward alone: the loss, computed after it, still runs its matmul in
    bf16, bit for bit as inside the autocast."""
    model = loss_llama()
    assert install_chunked_loss(model, chunk_tokens=8)
    ids, labels, weights = loss_batch()

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(input_ids=ids)

    assert final_hidden(model, forward).dtype == torch.bfloat16 and not torch.is_autocast_enabled("cpu")
    assert final_hidden(model, lambda: model(input_ids=ids)).dtype == torch.float32
    model.zero_grad(set_to_none=True)
    outside = token_losses(model, forward, labels).losses
    (outside * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = token_losses(model, lambda: model(input_ids=ids), labels).losses
    (inside * weights).sum().backward()
    assert torch.equal(outside, inside)
    assert all(torch.equal(p.grad, grads[n]) for n, p in model.named_parameters())


def stashed(model) -> list[str]:
    """Where a module holds a tensor outside its parameters and buffers, or its output layer's capture is not idle."""
    found = []
    for name, module in model.named_modules():
        for key, value in vars(module).items():
            if isinstance(value, torch.Tensor):
                found.append(f"{name}.{key}")
            if isinstance(value, Capture) and (value.active or value.taken is not None):
                found.append(f"{name}.{key} (capture)")
    return found


def test_no_module_carries_stashed_labels_or_hidden_states_after_a_forward():
    model = loss_llama()
    assert install_chunked_loss(model, chunk_tokens=4)
    ids, labels, weights = loss_batch()
    assert stashed(model) == []
    run(model, ids, labels, weights)
    assert stashed(model) == []
    with pytest.raises(ValueError, match="boom"):  # a forward that fails half-way leaves nothing behind either

        def failing():
            model(input_ids=ids)
            raise ValueError("boom")

        token_losses(model, failing, labels)
    assert stashed(model) == []
    assert model(input_ids=ids).logits.shape == (3, 11, model.config.vocab_size)  # the plain layer


def test_a_compiled_model_goes_through_the_same_call():
    """The pre-hook is there before ``compile`` (as the run installs the loss before compiling): the compiled forward
    takes the hidden states in the loss's forwards and is the plain model in the others."""
    plain = loss_llama()
    model = copy.deepcopy(plain)
    assert install_chunked_loss(model, chunk_tokens=4)
    model.compile(backend="aot_eager")
    ids, labels, weights = loss_batch()
    for _ in range(2):  # the plain forward and the loss's, twice: each compiled once, then reused
        assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits, "logits")
        loss_c, _, grads_c = run(model, ids, labels, weights)
        loss_p, _, grads_p = run(plain, ids, labels, weights)
        assert_close(loss_c, loss_p, "per-token losses")
        for name in grads_p:
            assert_close(grads_c[name], grads_p[name], name)
    assert stashed(model) == []


class StandIn(torch.nn.Module):
    """Liger's ``LigerFusedLinearCrossEntropyLoss`` on the CPU: the plain computation, as its CUDA kernel's result."""

    def __init__(self, ignore_index: int, reduction: str):
        super().__init__()
        assert (ignore_index, reduction) == (-100, "none")

    def forward(self, weight, flat, targets, bias=None):
        StandIn.dtypes = (weight.dtype, flat.dtype)
        return F.cross_entropy(F.linear(flat, weight, bias).float(), targets, ignore_index=-100, reduction="none")


def test_liger_kernel_goes_through_the_same_call(monkeypatch):
    """The Liger path (CUDA only) run with a CPU stand-in of its kernel: the same losses and gradients as the plain
    computation, the forward's autocast dtype, the targets of rows of weight 0 masked, and the guard against a
    non-uniform incoming gradient."""
    module = types.ModuleType("liger_kernel.transformers.fused_linear_cross_entropy")
    module.LigerFusedLinearCrossEntropyLoss = StandIn
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    plain = loss_llama()
    fused = copy.deepcopy(plain)
    assert install_chunked_loss(fused, kernel="liger")
    ids, labels, _ = loss_batch()
    uniform = torch.full((3, 10), 0.7)
    loss_p, _, grads_p = run(plain, ids, labels, uniform)
    loss_l, _, grads_l = run(fused, ids, labels, uniform)
    assert_close(loss_l, loss_p, "per-token losses")
    assert StandIn.dtypes == (torch.float32, torch.float32)
    for name in grads_p:
        assert_close(grads_l[name], grads_p[name], name)
    with pytest.raises(RuntimeError, match="set efficiency.chunked_loss=true"):
        run(fused, ids, labels, torch.rand(3, 10) + 0.5)
    masked = token_losses(fused, lambda: fused(input_ids=ids), labels, row_weights=torch.tensor([1.0, 0.0, 1.0]))
    assert (masked.losses[1] == 0).all() and torch.equal(masked.losses[[0, 2]], loss_l[[0, 2]])

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return fused(input_ids=ids)

    token_losses(fused, forward, labels)
    assert StandIn.dtypes == (torch.bfloat16, torch.bfloat16)


def test_the_entropy_makes_no_tokens_x_vocab_tensor():
    from tests.helpers import LargestTensor

    model = loss_llama()
    assert install_chunked_loss(model, chunk_tokens=16)
    ids, labels, weights = loss_batch(b=4, t=17)  # 64 targets > hidden 32: tokens x vocab is the largest possible
    vocab = model.config.vocab_size
    with LargestTensor() as seen:
        run(model, ids, labels, weights, entropy=True)
    assert seen.bytes <= 4 * max(16 * vocab, vocab * 32) < 4 * 64 * vocab, f"a tensor of {seen.bytes} bytes"
