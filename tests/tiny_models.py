"""Tiny random models built in memory from a config (no files), and the chunked-loss tests' batch and comparison:
``from tests.tiny_models import tiny_llama``. Model *folders* (tokenizer + weights on disk) are made by
tests/helpers.py (``make_tiny_bert``, ``make_tiny_llama``)."""

from __future__ import annotations

import torch

from leantrain.modeling.token_losses import token_losses

LOSS_VOCAB = 300  # loss_llama's vocabulary: more entries than hidden units, as a real LM


def tiny_bert_classifier(layers: int = 2):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=layers, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=2, n_positions=64))


def loss_llama(tied: bool = True, vocab: int = LOSS_VOCAB, seed: int = 0):
    """The output-layer tests' Llama: grouped-query attention, tied or untied output layer, fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tied, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(cfg).float()


def loss_batch(b: int = 3, t: int = 11, seed: int = 1):
    """Ids, labels with a prompt, padding and a lone ignored target, and a non-uniform weight per target."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, LOSS_VOCAB, (b, t), generator=g)
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt
    labels[1, -3:] = -100  # padding
    labels[2, 5] = -100
    weights = torch.rand(b, t - 1, generator=g) + 0.5  # a non-uniform incoming gradient per token
    return ids, labels, weights


def losses_and_grads(model, ids, labels, weights, chunked: bool = True):
    """Per-token losses and the gradients of their weighted sum, through ``token_losses``: the output loss installed
    on ``model`` (chunked or Liger), else the plain logits (``chunked`` says which the caller expects)."""
    from leantrain.modeling.chunked_loss import is_installed

    assert chunked or not is_installed(model), "the plain computation asked of a model with an output loss installed"
    model.zero_grad(set_to_none=True)
    losses = token_losses(model, lambda: model(input_ids=ids), labels).losses
    (losses * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return losses.detach(), grads


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str):
    """Equal to a relative error of 1e-5 of the larger magnitude."""
    err = (a - b).abs().max().item() / max(b.abs().max().item(), 1e-12)
    assert err <= 1e-5, f"{what}: relative error {err:.2e}"
