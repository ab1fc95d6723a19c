"""leantrain_sdpa (modeling/short_attention.py): SDPA's forward, the backward of short rows as matmuls in fp32.

Checked against the same attention in fp64 (transformers' SDPA function): its bf16 output is SDPA's, its gradients
at least as close to the fp64 ones as SDPA's own bf16 backward; grouped-query heads packed into rows, left padding,
a causal block without a mask; every call it does not take (fp32, no gradient, long rows, dropout) is transformers'
SDPA bit for bit; and a tiny Llama built with it trains to the loss and gradients of one built with SDPA."""

from __future__ import annotations

import copy
import types

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from leantrain.modeling.short_attention import MAX_SCORES, NAME, leantrain_sdpa, register, takes_short_backward

GQA = types.SimpleNamespace(num_key_value_groups=3, is_causal=True)  # what the functions read of the module


def _inputs(lq: int, lk: int, *, padded: bool = True, heads: int = 6, kv_heads: int = 2, dim: int = 16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, heads, lq, dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(3, kv_heads, lk, dim, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(3, 1, lq, lk, dtype=torch.bool).tril(lk - lq)
    if padded:
        mask[1, :, :, :4] = False  # a left-padded row
    return q, k, v, mask if padded else None


def _run(fn, q, k, v, mask, dtype, autocast: bool = False, module=GQA):
    """fn's output and the gradients of a fixed projection of it, for inputs cast to ``dtype`` (fp32 leaves under a
    bf16 autocast when ``autocast``)."""
    leaves = [t.to(torch.float32 if autocast else dtype).clone().requires_grad_() for t in (q, k, v)]
    with torch.autocast("cpu", dtype=dtype, enabled=autocast):
        out, _ = fn(module, *leaves, mask, scaling=q.shape[-1] ** -0.5)
    weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)
    (out.double() * weights).sum().backward()
    return [out.detach().double(), *(t.grad.double() for t in leaves), _backward_of(out)]


def _backward_of(out: torch.Tensor) -> str:
    """"short" when the graph of ``out`` goes through the matmul backward, else "sdpa"."""
    seen, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        if "ShortBackward" in type(fn).__name__:
            return "short"
        todo += [f for f, _ in fn.next_functions]
    return "sdpa"


def _errors(got, ref):
    return [((a - r).abs().max() / r.abs().max()).item() for a, r in zip(got, ref)]


@pytest.mark.parametrize("padded", [True, False], ids=["padding mask", "causal without mask"])
@pytest.mark.parametrize("autocast", [False, True], ids=["bf16 inputs", "fp32 inputs under autocast"])
def test_bf16_gradients_at_least_as_close_to_fp64_as_sdpas_own(padded, autocast):
    q, k, v, mask = _inputs(12, 12 if not padded else 20, padded=padded)
    ref = _run(sdpa_attention_forward, q, k, v, mask, torch.float64)
    sdpa = _run(sdpa_attention_forward, q, k, v, mask, torch.bfloat16, autocast)
    ours = _run(leantrain_sdpa, q, k, v, mask, torch.bfloat16, autocast)
    assert ours[-1] == "short" and sdpa[-1] == "sdpa"
    assert torch.allclose(ours[0], sdpa[0], rtol=0, atol=2e-2)  # SDPA's forward, up to bf16 rounding
    for name, e_ours, e_sdpa in zip(("out", "q", "k", "v"), _errors(ours[:4], ref), _errors(sdpa[:4], ref)):
        assert e_ours < 1.5e-2 and e_ours <= 1.2 * e_sdpa + 1e-3, (name, e_ours, e_sdpa)


def test_the_backward_is_the_fp32_one_of_the_same_attention():
    """In fp32 the gradients are exact: the matmul backward against SDPA's fp64 within fp32 rounding."""
    from leantrain.modeling.short_attention import _ShortBackward

    q, k, v, mask = _inputs(12, 20, heads=2, kv_heads=2)
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    out = _ShortBackward.apply(*leaves, mask, 0.25)
    out.square().sum().backward()
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*ref, attn_mask=mask, scale=0.25).square().sum().backward()
    for a, b in zip(leaves, ref):
        torch.testing.assert_close(a.grad.double(), b.grad, rtol=1e-5, atol=1e-5)


def test_every_other_call_is_transformers_sdpa_bit_for_bit():
    q, k, v, mask = _inputs(12, 20)
    for args in [(q, k, v, mask, torch.float32), (q, k, v, mask, torch.float64)]:  # full precision
        for a, b in zip(_run(leantrain_sdpa, *args)[:4], _run(sdpa_attention_forward, *args)[:4]):
            assert torch.equal(a, b)
    long_q, long_k, long_v, long_mask = _inputs(128, 130)  # more scores a head than MAX_SCORES
    assert 128 * 130 > MAX_SCORES
    assert not takes_short_backward(long_q.bfloat16(), long_k.bfloat16(), long_v.bfloat16(), long_mask, 0.0, {})
    for a, b in zip(_run(leantrain_sdpa, long_q, long_k, long_v, long_mask, torch.bfloat16),
                    _run(sdpa_attention_forward, long_q, long_k, long_v, long_mask, torch.bfloat16)):
        assert a == b if isinstance(a, str) else torch.equal(a, b)
    bf = [t.bfloat16() for t in (q, k, v)]
    assert not takes_short_backward(*bf, mask, 0.1, {})  # dropout
    assert not takes_short_backward(*bf, mask.float(), 0.0, {})  # a float mask (a bias)
    assert not takes_short_backward(*bf, mask, 0.0, {"softcap": 30.0})
    assert not takes_short_backward(*bf, mask, 0.0, {})  # no gradient wanted
    with torch.no_grad():
        got, _ = leantrain_sdpa(GQA, *bf, mask, scaling=0.25)
        want, _ = sdpa_attention_forward(GQA, *bf, mask, scaling=0.25)
    assert torch.equal(got, want)


def test_a_llama_built_with_it_trains_like_one_built_with_sdpa(tmp_path):
    """Under bf16 autocast: the same loss, and every parameter's gradient as close to the fp32 model's as SDPA's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    register()
    cfg = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    weights = LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa").state_dict()
    ids = torch.randint(0, 64, (4, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a left-padded row; the others take the causal block without a mask

    def trained(name: str, autocast: bool):
        model = LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=name)
        model.load_state_dict(weights)
        assert model.config._attn_implementation == name
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        return model, loss.item(), {n: p.grad for n, p in model.named_parameters()}

    _, _, exact = trained("sdpa", autocast=False)
    _, loss_sdpa, sdpa = trained("sdpa", autocast=True)
    ours_model, loss_ours, ours = trained(NAME, autocast=True)
    assert loss_ours == loss_sdpa  # the same forward
    for n, g in exact.items():
        e_ours, e_sdpa = ((ours[n] - g).norm() / g.norm()).item(), ((sdpa[n] - g).norm() / g.norm()).item()
        assert e_ours < 1.5e-2 and e_ours <= 1.25 * e_sdpa + 1e-3, (n, e_ours, e_sdpa)
    ours_model.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()  # the saved model is a plain Llama
