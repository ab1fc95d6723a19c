"""Model FLOPs per token of a causal LM (6 N + 12 L h s), against a count by hand from the config's dimensions; the
GPUs' peak FLOP/s the MFU is computed against."""

from __future__ import annotations

import pytest

from leantrain.modeling.load import flop_parameters, parameter_counts
from leantrain.perf.flops import flops_per_token, gpu_peak, mfu


def llama(tied: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=500, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied))


@pytest.mark.parametrize("tied", [True, False])
def test_causal_lm_flops_per_token_by_hand(tied):
    model = llama(tied)
    v, h, i, layers, head_dim, kv = 500, 64, 96, 3, 16, 2
    per_layer = h * h + 2 * h * (kv * head_dim) + h * h + 3 * h * i + 2 * h  # q, k+v, o, gate/up/down, 2 norms
    by_hand = layers * per_layer + h + v * h  # + final norm + the output layer (a matmul per token, tied or not)
    n = flop_parameters(model, parameter_counts(model))
    assert n == by_hand
    assert flops_per_token(model.config, n, 256) == 6 * by_hand + 12 * layers * h * 256


def test_a_classifier_counts_its_non_embedding_parameters(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from tests.helpers import make_tiny_bert

    bert = AutoModelForSequenceClassification.from_pretrained(make_tiny_bert(tmp_path / "bert"))
    counts = parameter_counts(bert)
    assert flop_parameters(bert, counts) == counts["non_embedding"]


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H200", "bf16", 989.4e12), ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
    ("NVIDIA H100 PCIe", "bf16", 756e12), ("NVIDIA A100-SXM4-80GB", "bf16", 312e12), ("NVIDIA H200", "fp8", 1978.9e12)])
def test_gpu_peak_by_device_name(name, precision, peak):
    found, source = gpu_peak(name, precision)
    assert found == peak and source == f"data sheet ({name}, {precision})"
    assert mfu(1e9, 0.4 * peak / 1e9, found) == pytest.approx(0.4)


def test_an_unknown_gpu_or_precision_has_no_mfu_and_says_so():
    peak, source = gpu_peak("Some Future GPU 9000", "bf16")
    assert peak is None and source.startswith("unknown GPU 'Some Future GPU 9000': no MFU")
    assert mfu(1e9, 1000.0, peak) is None
    peak, source = gpu_peak("NVIDIA A100-SXM4-80GB", "fp8")  # no fp8 tensor cores
    assert peak is None and "no fp8 peak for 'NVIDIA A100-SXM4-80GB'" in source
