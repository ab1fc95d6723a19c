"""The evaluation's batch width planned against the memory budget (``engine.eval_plan``): a width whose evaluation
forward (priced on fake tensors) does not fit is halved until it does; the chunked output layer is what makes a wide
batch cheap."""

from __future__ import annotations

import torch

from leantrain.engine.evaluation.eval_plan import planned_eval_width
from leantrain.modeling.chunked_loss import install_chunked_loss
from leantrain.methods.lm.causal_lm import CAUSAL_LM_TASK
from leantrain.perf.estimate import fake_eval_peak
from leantrain.perf.memory_model import resident_bytes

VOCAB, SEQ = 2**15, 64  # plain logits: 8 MiB a row


def tiny_lm():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ))


def test_a_width_that_does_not_fit_the_budget_is_halved_and_the_chunked_layer_makes_it_fit():
    model = tiny_lm()
    four, eight = (fake_eval_peak(model, CAUSAL_LM_TASK, w, SEQ, "fp32") for w in (4, 8))
    assert eight - four >= 4 * SEQ * VOCAB * 4  # the plain logits of 4 more rows
    budget = resident_bytes(torch.device("cpu")) + int(four * 1.25) + 2 * SEQ * VOCAB * 4  # room for 4, not 8
    width, why = planned_eval_width(model, CAUSAL_LM_TASK, 64, SEQ, "fp32", budget)
    assert width == 4, why
    assert install_chunked_loss(model)
    chunked = fake_eval_peak(model, CAUSAL_LM_TASK, 64, SEQ, "fp32")
    assert chunked < eight  # 64 rows through the chunked layer cost less than 8 rows' plain logits
    assert planned_eval_width(model, CAUSAL_LM_TASK, 64, SEQ, "fp32", budget)[0] == 64
