"""Model FLOPs per token of a causal LM (6 N + 12 L h s), against a count by hand from the config's dimensions; the
GPUs' peak FLOP/s the MFU is computed against."""

from __future__ import annotations

import pytest

from leantrain.modeling.load import flop_parameters, parameter_counts
from leantrain.perf.flops import MfuMeter, flops_per_token, gpu_peak, gpu_peak_flops, mfu


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


def test_bert_classifier_flops_per_token_by_hand():
    """6 N + 12 L h s for a BERT classifier, N counted by hand from the config's dimensions."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    v, h, i, layers, labels, s = 100, 32, 64, 2, 3, 40
    config = BertConfig(vocab_size=v, hidden_size=h, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=i, max_position_embeddings=64, num_labels=labels)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    per_layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h  # q k v o, LayerNorm, FFN, LayerNorm
    by_hand = 2 * h + layers * per_layer + (h * h + h) + (h * labels + labels)  # + embedding LN, pooler, classifier
    n = flop_parameters(model, parameter_counts(model))
    assert n == by_hand
    assert flops_per_token(model.config, n, s) == 6 * by_hand + 12 * layers * h * s


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
    ("NVIDIA H100 PCIe", "bf16", 756e12),   # the PCIe part, not the SXM one whose name it contains
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),  # A100, not A10
    ("NVIDIA A10G", "bf16", 70e12),         # A10G, not A10
    ("NVIDIA L40S", "fp8", 733e12),         # L40S, not L4
    ("Tesla V100-SXM2-16GB", "bf16", None),  # no bf16 on a V100
    ("Some Future GPU", "bf16", None),
])
def test_gpu_peak_flops_picks_the_most_specific_name(name, precision, peak):
    assert gpu_peak_flops(name, precision) == peak


def test_mfu_formula_and_when_there_is_none():
    assert mfu(1e6, 2e3, 4e9, processes=2) == pytest.approx(1e6 * 2e3 / (4e9 * 2))
    assert mfu(1e6, 2e3, None) is None and mfu(1e6, 0.0, 4e9) is None and mfu(1e6, 2e3, 0.0) is None


def test_cpu_peak_flops_reads_its_cache_and_writes_a_new_entry(tmp_path, monkeypatch):
    import json

    import torch

    from leantrain.perf.flops import cpu_model, cpu_peak_flops

    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    key = f"{cpu_model()}|threads={torch.get_num_threads()}|fp32|torch={torch.__version__}"
    (tmp_path / "peak_flops.json").write_text(json.dumps({key: 1234.0}))
    assert cpu_peak_flops("fp32") == 1234.0  # the cached figure, no probe
    assert cpu_peak_flops("fp8") is None  # no CPU dtype for it
    (tmp_path / "peak_flops.json").write_text("{half a file")
    probed = cpu_peak_flops("fp32")  # a broken cache is measured again and rewritten whole
    assert probed > 0 and json.loads((tmp_path / "peak_flops.json").read_text()) == {key: probed}
    assert not list(tmp_path.glob("*.tmp"))


def test_mfu_meter_on_a_device_without_a_peak():
    import torch
    from transformers import BertConfig

    meter = MfuMeter(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2), 1000, 10.0,
                     torch.device("meta"), "fp32", processes=1)
    assert meter.flops_per_token == 6 * 1000 + 12 * 2 * 32 * 10
    assert meter.summary(500.0) == {"mfu": None, "peak_flops": None, "peak_flops_source": "no peak FLOP/s known for meta",
                                    "flops_per_token": meter.flops_per_token}


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


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_cpu_peak_probe_leaves_the_global_generator_alone(tmp_path, monkeypatch, precision):
    """The matmul probe runs only on a cache miss (a new machine, thread count or precision): it must not move the
    global generator, or a run's dropout would depend on the cache (a run that probed at its start differed from its
    own resume on a CPU whose bf16 key was not cached yet). The cache hit that follows returns the probed number."""
    import torch

    from leantrain.perf.flops import cpu_peak_flops

    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    torch.manual_seed(3)
    before = torch.get_rng_state()
    probed = cpu_peak_flops(precision)
    assert torch.equal(torch.get_rng_state(), before)
    assert probed > 0 and cpu_peak_flops(precision) == probed
