"""The memory model on a causal LM: its calibration passes run the LM's loss (plain or chunked), and the logits get
a line of their own (plain: tokens x vocab; chunked: one chunk) without changing the calibrated total."""

from __future__ import annotations

import copy

import pytest

from leantrain.modeling.chunked_loss import install_chunked_loss
from leantrain.methods.lm.causal_lm import CAUSAL_LM_TASK
from leantrain.perf import memory_model


@pytest.fixture(scope="module")
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


@pytest.mark.parametrize("chunked", [False, True])
def test_calibration_runs_the_causal_lm_loss_and_lines_show_the_logits(llama, chunked):
    model = copy.deepcopy(llama)
    if chunked:
        assert install_chunked_loss(model, chunk_tokens=8)
    cal = memory_model.calibrate(model, 32, "fp32", False, per_process=4, timing=False, size=4, task=CAUSAL_LM_TASK)
    assert cal.saved[1] > cal.saved[0] > 0
    facts = memory_model.model_facts(model, framework_bytes=0)
    assert (facts.vocab, facts.chunk_tokens) == (400, 8 if chunked else 0)
    lines = memory_model.lines(facts, cal, 4, state_bytes=0)
    expected = (2 * 8 * 400 * 4 + 8 * 128) if chunked else 128 * 400 * (4 + 4 + 4)
    assert lines["logits"] == min(expected, lines["logits"] + lines["activations"] + lines["temporary_buffers"])
    assert lines["total"] == sum(v for k, v in lines.items() if k != "total")


def test_logits_bytes_plain_and_chunked():
    facts = memory_model.ModelFacts(0, 0, 0, 0, 0, 0, vocab=50257)
    assert memory_model.logits_bytes(facts, "bf16", 4096) == 4096 * 50257 * (2 + 4 + 4)
    facts.chunk_tokens = 256
    assert memory_model.logits_bytes(facts, "bf16", 4096) == 2 * 256 * 50257 * 4 + 8 * 4096
    assert memory_model.logits_bytes(memory_model.ModelFacts(0, 0, 0, 0, 0, 0), "fp32", 4096) == 0


@pytest.mark.parametrize("chunked", ["false", "true"])
def test_plan_of_a_causal_lm_shows_its_logits(tmp_path, chunked, capsys):
    from leantrain.commands.plan import run_plan
    from tests.helpers import TINY_LLAMA, lm_documents, make_tiny_lm_tokenizer

    tok = make_tiny_lm_tokenizer(tmp_path / "tok")
    (tmp_path / "train.txt").write_text("\n\n".join(lm_documents(40, 0)))
    plan = run_plan(None, [*TINY_LLAMA, "model.task=causal-lm", f"model.tokenizer={tok}",
                           f"data.train={tmp_path / 'train.txt'}", "data.block_size=32", "train.batch_size=4",
                           "efficiency.precision=fp32", f"efficiency.chunked_loss={chunked}",
                           f"output_dir={tmp_path / 'out'}"], as_json=True)
    lines = plan["lines"]
    assert plan["seq_len"] == 32 and lines["logits"] > 0
    assert lines["total"] == sum(v for k, v in lines.items() if k != "total")


def test_a_reference_forward_in_the_step_raises_the_planned_peak(llama):
    """The preference task: live (and adapter) run the reference's no-grad forward in each step, precompute reads
    the log-probs from the batch; the memory model's passes do as training does, so live plans a higher peak."""
    from leantrain.config import resolve
    from leantrain.methods import get_task
    from leantrain.perf import estimate

    model, totals = copy.deepcopy(llama), {}
    facts = memory_model.model_facts(model, framework_bytes=0)
    for reference in ("precompute", "live"):
        cfg = resolve(None, ["preference.loss=dpo", f"preference.reference={reference}"])  # auto: the data decides
        task = get_task("preference").configured(cfg)
        cal = estimate.estimate(model, 32, "fp32", False, task=task.model.bind(model))
        totals[reference] = memory_model.lines(facts, cal, 4, state_bytes=0)["total"]
    assert totals["live"] > totals["precompute"], totals
