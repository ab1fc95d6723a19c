"""Weight casts made again in the backward (leantrain.modeling.weight_casts): the same outputs and gradients as
autocast's own linear, bit for bit, for trained and frozen weights, with less kept for the backward."""

import copy

import pytest
import torch
from torch import nn

from leantrain.modeling.chunked_loss import install_chunked_loss
from leantrain.modeling.token_losses import token_losses
from leantrain.modeling.weight_casts import RecastLinear, install_recast
from tests.helpers import WeightCasts
from tests.tiny_models import loss_batch, loss_llama


def loss_and_grads(model, ids, weights, autocast=True):
    """The forward under bf16 autocast (as Accelerate wraps it), a weighted loss, its backward; the loss and every
    gradient (parameters', and the input embeddings' output, which reaches the first layers through the casts)."""
    model.train()
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(inputs_embeds=embeds).logits
    loss = (logits.float().log_softmax(-1)[:, :-1, :5].sum(-1) * weights).sum()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), {**grads, "inputs_embeds": embeds.grad}


def saved_bytes(model, ids) -> int:
    """Bytes of the distinct storages the forward keeps for its backward, the parameters' own left out (alive
    anyway)."""
    storages = {}
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model.train()
        model(input_ids=ids).logits.float().sum().backward()
    return sum(storages.values())


def recast_copy(model):
    twin = copy.deepcopy(model)
    assert install_recast(twin) == 15  # 2 layers x (q, k, v, o, gate, up, down) and lm_head
    return twin


@pytest.mark.parametrize("frozen,tied", [(False, False), (False, True), (True, False)],
                         ids=["trained", "trained-tied", "frozen-linears"])
def test_same_loss_and_gradients_bit_for_bit(frozen, tied):
    plain = loss_llama(tied=tied)
    if frozen:  # LoRA's case: the linear weights frozen, the rest (norms, embeddings) trained
        for m in plain.modules():
            if isinstance(m, nn.Linear):
                m.weight.requires_grad_(False)
    recast = recast_copy(plain)
    ids, _, weights = loss_batch()
    loss_a, grads_a = loss_and_grads(plain, ids, weights)
    loss_b, grads_b = loss_and_grads(recast, ids, weights)
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 3
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def test_under_lora_the_adapters_get_the_same_gradients():
    peft = pytest.importorskip("peft")
    ids, _, weights = loss_batch()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)
    plain = peft.get_peft_model(loss_llama(), config)
    recast = copy.deepcopy(plain)
    assert install_recast(recast) > 15  # the frozen base layers and the adapters' own bias-free linears
    _, grads_a = loss_and_grads(plain, ids, weights)
    _, grads_b = loss_and_grads(recast, ids, weights)
    assert any("lora_A" in n for n in grads_a) and grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name


def test_the_forward_keeps_no_bf16_copy_of_the_weights_and_one_of_a_shared_input():
    plain = loss_llama(tied=False)
    recast = recast_copy(plain)
    ids, _, _ = loss_batch()
    casts = sum(2 * m.weight.numel() for m in recast.modules() if isinstance(m, RecastLinear))
    # per layer, autocast's bf16 copies of the normed input: q, k, v one each, gate and up one each; here one and one
    # (lm_head reads its input alone)
    shared = 2 * ids.numel() * plain.config.hidden_size * 3 * plain.config.num_hidden_layers
    assert saved_bytes(plain, ids) - saved_bytes(recast, ids) == casts + shared


def test_no_rows_no_cast():
    """An empty input (GRPO's prompt forward keeps no logits) gives an empty output without casting the weight."""
    layer = nn.Linear(8, 300, bias=False)
    assert install_recast(layer) == 1
    with torch.autocast("cpu", dtype=torch.bfloat16), WeightCasts() as casts:
        empty = layer(torch.randn(2, 0, 8))
        assert casts.count == 0 and empty.shape == (2, 0, 300) and empty.dtype == torch.bfloat16
        layer(torch.randn(2, 1, 8))
    assert casts.count == 1


def test_outside_a_training_forward_under_autocast_it_is_the_plain_linear():
    plain = loss_llama(tied=False)
    recast = recast_copy(plain)
    ids, _, weights = loss_batch()
    loss_a, grads_a = loss_and_grads(plain, ids, weights, autocast=False)  # fp32: no cast to make again
    loss_b, grads_b = loss_and_grads(recast, ids, weights, autocast=False)
    assert torch.equal(loss_a, loss_b) and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # evaluation and generation
        assert torch.equal(plain.eval()(input_ids=ids).logits, recast.eval()(input_ids=ids).logits)


def test_only_plain_bias_free_linears_are_swapped_and_the_state_dict_is_unchanged():
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.Linear(4, 4), nn.Linear(4, 4, bias=False))
    keys = list(model.state_dict())
    assert install_recast(model) == 2
    assert [type(m) for m in model] == [RecastLinear, nn.Linear, RecastLinear]
    assert list(model.state_dict()) == keys


def test_under_the_chunked_loss_installed_after_it_the_same_gradients():
    """GRPO's step: the chunked layer's losses, and the plain logits of the output layer (the prompts' last
    position), in one backward, with the tied output layer a RecastLinear under the chunked layer."""
    plain = loss_llama(tied=True)
    recast = recast_copy(plain)
    for model in (plain, recast):
        assert install_chunked_loss(model, chunk_tokens=8)
    ids, labels, weights = loss_batch()
    grads = []
    for model in (plain, recast):
        model.train()

        def forward(model=model):  # a forward an autocast, as Accelerate wraps the model's forward
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return model(input_ids=ids)

        losses = token_losses(model, forward, labels).losses
        with torch.autocast("cpu", dtype=torch.bfloat16):
            last = model(input_ids=ids, logits_to_keep=1).logits.float()
        ((losses * weights).sum() + last.log_softmax(-1)[..., :5].sum()).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert torch.equal(grads[0][name], grads[1][name]), name
