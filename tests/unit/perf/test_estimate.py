"""The first stage of `leantrain plan`: a forward/backward on fake tensors prices the memory without arithmetic; it
counts what the real calibration counts, and the plan measures with real passes only where the estimate is close to
the budget (or with --calibrate)."""

from __future__ import annotations

import copy

import pytest

from leantrain.modeling.chunked_loss import install_chunked_loss
from leantrain.methods import get_task
from leantrain.perf import estimate, memory_model


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


@pytest.mark.parametrize("precision,ckpt,chunked", [("fp32", False, False), ("bf16", True, False),
                                                    ("bf16", False, True)])
def test_fake_passes_count_the_bytes_real_passes_save(llama, precision, ckpt, chunked):
    model = copy.deepcopy(llama)
    if chunked:
        assert install_chunked_loss(model, chunk_tokens=8)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    task = get_task("causal-lm")
    real = memory_model.calibrate(model, 32, precision, ckpt, per_process=2, timing=False, size=2, task=task)
    est = estimate.estimate(model, 32, precision, ckpt, task=task)
    assert est.method == "estimated" and est.sizes == real.sizes == (1, 2)
    # the fake pass counts each saved storage once by identity, the real one by its address: within a block's worth
    for fake, measured in zip(est.saved, real.saved):
        assert fake == pytest.approx(measured, rel=0.25, abs=64 * 1024)
    assert est.saved[1] > est.saved[0] > 0 and est.peak[1] > est.peak[0] >= est.saved[0]
    assert all(p.grad is None and p.equal(before[n]) for n, p in model.named_parameters())  # nothing changed


def _plan(tmp_path, **kw):
    from leantrain.commands.plan import run_plan
    from tests.helpers import TINY_LLAMA, lm_documents, make_tiny_lm_tokenizer

    tok = make_tiny_lm_tokenizer(tmp_path / "tok")
    (tmp_path / "train.txt").write_text("\n\n".join(lm_documents(40, 0)))
    return run_plan(None, [*TINY_LLAMA, "model.task=causal-lm", f"model.tokenizer={tok}",
                           f"data.train={tmp_path / 'train.txt'}", "data.block_size=32", "train.batch_size=4",
                           "efficiency.precision=fp32", f"output_dir={tmp_path / 'out'}"], as_json=True, **kw)


def test_plan_estimates_first_and_measures_where_cheap_or_asked(tmp_path):
    only = _plan(tmp_path, calibrate=False)  # --no-calibrate: the estimate alone
    assert only["method"] == "estimated" and [c["method"] for c in only["calibration"]] == ["estimated"]
    cheap = _plan(tmp_path)  # a tiny model's real passes take milliseconds: measured by default
    assert cheap["method"] == "measured" and cheap["calibration"][0]["sizes"] == (1, 4)  # at the config's micro-batch
    assert cheap["calibration"][1]["method"] == "estimated"  # the estimate came first


def test_real_passes_decide_only_where_the_estimates_error_could_flip_the_fit():
    from leantrain.commands.plan import CLOSE, _near_budget
    from leantrain.perf.auto_micro_batch import need_bytes

    lines = {"framework_overhead": 10 * 2**30, "activations": 5 * 2**30, "total": 15 * 2**30}
    need = need_bytes(lines)
    assert _near_budget(lines, need) and _near_budget(lines, int(need * (1 + CLOSE / 5)))
    assert not _near_budget(lines, 2 * need) and not _near_budget(lines, need // 2)
