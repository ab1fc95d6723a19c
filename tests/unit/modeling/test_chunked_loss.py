"""The chunked loss (efficiency.chunked_loss): per-token losses and gradients equal the plain computation, no
tokens x vocab tensor is ever made, the model is otherwise unchanged, and models it cannot serve are refused."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from leantrain.errors import ConfigError
from tests.tiny_models import LOSS_VOCAB, assert_close, loss_batch, loss_llama, losses_and_grads
from leantrain.modeling.chunked_loss import (apply_chunked_loss, default_chunk_tokens, final_hidden,
                                             install_chunked_loss, is_installed, why_not_chunked)
from leantrain.modeling.token_losses import logit_losses, token_losses


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("chunk", [7, 64])  # 7 does not divide the 30 targets; 64 is more than all of them
def test_loss_and_gradients_equal_the_plain_computation(tied, chunk):
    plain = loss_llama(tied)
    chunked = copy.deepcopy(plain)
    assert install_chunked_loss(chunked, chunk_tokens=chunk)
    ids, labels, weights = loss_batch()
    loss_p, grads_p = losses_and_grads(plain, ids, labels, weights, chunked=False)
    loss_c, grads_c = losses_and_grads(chunked, ids, labels, weights, chunked=True)
    assert loss_c.shape == (3, 10) and loss_c.dtype == torch.float32
    assert (loss_c[labels[:, 1:] == -100] == 0).all()
    assert_close(loss_c, loss_p, "per-token losses")
    assert grads_c.keys() == grads_p.keys()
    assert "lm_head.weight" in grads_c or tied
    for name in grads_p:
        assert_close(grads_c[name], grads_p[name], name)


def test_gradient_of_the_hidden_states_weight_and_bias_equal_plain():
    from leantrain.modeling.chunked_loss import chunked_token_losses

    torch.manual_seed(0)
    layer = torch.nn.Linear(16, LOSS_VOCAB, bias=True)
    hidden = torch.randn(2, 9, 16, requires_grad=True)
    labels = torch.randint(0, LOSS_VOCAB, (2, 9))
    labels[1, 3] = -100
    w = torch.rand(2, 8)
    plain = logit_losses(layer(hidden), labels)[0]
    (plain * w).sum().backward()
    want = hidden.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone()
    hidden.grad = layer.weight.grad = layer.bias.grad = None
    flat, targets = hidden[:, :-1].reshape(-1, 16), labels[:, 1:].reshape(-1)
    chunked = chunked_token_losses(flat, layer, targets, 5, torch.float32)[0].view(2, 8)
    (chunked * w).sum().backward()
    assert_close(chunked.detach(), plain.detach(), "losses")
    for got, exp, what in zip((hidden.grad, layer.weight.grad, layer.bias.grad), want, ("hidden", "weight", "bias")):
        assert_close(got, exp, what)


def test_bf16_autocast_is_close_to_plain():
    plain = loss_llama()
    chunked = copy.deepcopy(plain)
    install_chunked_loss(chunked, chunk_tokens=8)
    ids, labels, weights = loss_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_p, grads_p = losses_and_grads(plain, ids, labels, weights, chunked=False)
        loss_c, grads_c = losses_and_grads(chunked, ids, labels, weights, chunked=True)
    assert torch.allclose(loss_c, loss_p, rtol=2e-2, atol=2e-2)
    for name in grads_p:
        assert torch.allclose(grads_c[name], grads_p[name], rtol=5e-2, atol=5e-3), name


class LargestTensor(TorchDispatchMode):
    """The largest number of elements of any tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("chunked", [True, False])
def test_no_tokens_x_vocab_tensor_exists_in_forward_or_backward(chunked):
    model = loss_llama()
    if chunked:
        install_chunked_loss(model, chunk_tokens=16)
    ids, labels, weights = loss_batch(b=4, t=17)  # 64 targets > hidden 32: tokens x vocab is the largest possible size
    tokens = 4 * 16
    with LargestTensor() as seen:
        losses_and_grads(model, ids, labels, weights, chunked=chunked)
    if chunked:
        # the largest are the weight's gradient (vocab x hidden) or one chunk's logits, far below tokens x vocab
        assert seen.largest <= max(16 * LOSS_VOCAB, LOSS_VOCAB * 32) < tokens * LOSS_VOCAB, f"a tensor of {seen.largest} elements"
    else:  # the check can fail: the plain path makes the full logits
        assert seen.largest >= tokens * LOSS_VOCAB


def test_state_dict_tied_weights_and_generation_unchanged():
    model = loss_llama(tied=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[5, 6, 7, 8]])
    gen_before = model.generate(ids, max_new_tokens=6, do_sample=False)
    logits_before = model(input_ids=ids).logits
    assert install_chunked_loss(model, chunk_tokens=3)
    assert is_installed(model)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), gen_before)
    assert torch.equal(model(input_ids=ids).logits, logits_before)  # outside final_hidden: the plain layer
    seen = []
    hidden = final_hidden(model, lambda: seen.append(model(input_ids=ids).logits.shape))
    assert hidden.states.shape == (1, 4, 32) and hidden.dtype == torch.float32
    assert seen == [(1, 0, LOSS_VOCAB)]  # the output layer computed nothing
    assert torch.equal(model(input_ids=ids).logits, logits_before)  # the plain layer again after it


def test_a_deep_copy_of_an_installed_model_computes_with_its_own_weights():
    """The live reference is a deep copy of the policy: its output layer is its own, plain outside the loss and with
    its own weight in it, not the one it was copied from (whose weights train on)."""
    import copy

    model = loss_llama()
    assert install_chunked_loss(model, chunk_tokens=3)
    twin = copy.deepcopy(model)
    ids = torch.tensor([[5, 6, 7, 8]])
    before = twin(input_ids=ids).logits
    losses = token_losses(twin, lambda: twin(input_ids=ids), ids).losses
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert torch.equal(twin(input_ids=ids).logits, before)
    assert torch.equal(token_losses(twin, lambda: twin(input_ids=ids), ids).losses, losses)


def test_the_losses_come_through_a_wrapper():
    class Wrapper(torch.nn.Module):  # as DDP / FSDP1 hold the model in .module
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, **kw):
            return self.module(**kw)

    plain = loss_llama()
    model = copy.deepcopy(plain)
    install_chunked_loss(model)
    ids, labels, _ = loss_batch()
    wrapped = Wrapper(model)
    losses = token_losses(wrapped, lambda: wrapped(input_ids=ids), labels).losses
    assert losses.shape == (3, 10)
    assert_close(losses, token_losses(plain, lambda: plain(input_ids=ids), labels).losses, "per-token losses")


def test_models_that_postprocess_their_logits_are_refused():
    from transformers import Gemma2Config, Gemma2ForCausalLM, LlamaForCausalLM

    gemma = Gemma2ForCausalLM(Gemma2Config(vocab_size=LOSS_VOCAB, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                           head_dim=16, final_logit_softcapping=30.0))
    assert "final_logit_softcapping" in why_not_chunked(gemma)
    assert not install_chunked_loss(gemma)
    with pytest.raises(ConfigError, match="efficiency.chunked_loss=true: .*final_logit_softcapping"):
        apply_chunked_loss(gemma, True)
    assert "off" in apply_chunked_loss(gemma, "auto")

    class ScaledForCausalLM(LlamaForCausalLM):  # post-processing no config field names: the probe finds it
        def forward(self, *a, **kw):
            out = super().forward(*a, **kw)
            out.logits = out.logits * 2
            return out

    scaled = ScaledForCausalLM(loss_llama().config)
    assert "differ from the output layer" in why_not_chunked(scaled)
    assert not install_chunked_loss(scaled)


def test_not_a_causal_lm(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from tests.helpers import make_tiny_bert

    bert = AutoModelForSequenceClassification.from_pretrained(make_tiny_bert(tmp_path / "bert"))
    assert apply_chunked_loss(bert, "auto") is None  # nothing to say for a classifier
    with pytest.raises(ConfigError, match="not a causal language model"):
        apply_chunked_loss(bert, True)


def test_the_setting():
    small = loss_llama()
    assert "off (auto: vocabulary 300 < 8192" in apply_chunked_loss(small, "auto") and not is_installed(small)
    assert "on (as configured" in apply_chunked_loss(small, True) and is_installed(small)
    big = loss_llama(vocab=8192)
    assert "on (auto: cpu has no fused kernel; vocabulary 8192, chunks of 2048 tokens on CPU, 4096 on GPUs" in apply_chunked_loss(big, "auto")
    off = loss_llama(vocab=8192)
    assert "off (efficiency.chunked_loss=false)" in apply_chunked_loss(off, False) and not is_installed(off)
    assert default_chunk_tokens(50257) == 256 and default_chunk_tokens(151936) == 64
    assert default_chunk_tokens(50257, "cuda") == 1024 and default_chunk_tokens(151936, "cuda") == 256


def test_token_losses_checks_shapes():
    model = loss_llama()
    install_chunked_loss(model)
    ids, labels, _ = loss_batch()
    with pytest.raises(ValueError, match="do not match"):
        token_losses(model, lambda: model(input_ids=ids), labels[:, 1:])
