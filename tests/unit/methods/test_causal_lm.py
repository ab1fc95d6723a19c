"""The causal-LM task: loss sum and target count against a plain torch computation, the global normalisation over
micro-batches with different numbers of targets, exact evaluation over uneven batches, model.task=auto, and the
model from a config with model.tokenizer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from leantrain.config import resolve
from leantrain.errors import ConfigError
from leantrain.methods import get_task
from tests.helpers import TINY_LLAMA, make_tiny_llama, make_tiny_lm_tokenizer

IGNORE = -100


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    tok = make_tiny_lm_tokenizer(root / "tok")
    return tok, make_tiny_llama(root / "llama", tok)


@pytest.fixture(scope="module")
def model(tiny):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny[1]).eval()


def rows(n: int, seed: int, vocab: int = 150, max_len: int = 12) -> list[dict]:
    """Rows as the tokens data side gives them: input_ids, unshifted labels with some -100, targets."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(2, max_len + 1, (1,), generator=g))
        ids = torch.randint(2, vocab, (length,), generator=g).tolist()
        labels = [t if float(torch.rand((), generator=g)) > 0.3 else IGNORE for t in ids]
        out.append({"input_ids": ids, "labels": labels, "length": length,
                    "targets": sum(1 for x in labels[1:] if x != IGNORE)})
    return out


def collate(batch: list[dict], weights: list[float] | None = None) -> dict:
    """Right-padded tensors (pad 1 = EOS, labels -100), an attention mask and loss weights."""
    t = max(len(r["input_ids"]) for r in batch)
    ids = torch.tensor([r["input_ids"] + [1] * (t - len(r["input_ids"])) for r in batch])
    labels = torch.tensor([r["labels"] + [IGNORE] * (t - len(r["labels"])) for r in batch])
    mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (t - len(r["input_ids"])) for r in batch])
    w = torch.tensor(weights if weights is not None else [1.0] * len(batch))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "loss_weight": w}


def plain_token_losses(model, batch: dict) -> torch.Tensor:
    """Per-row summed CE of the shifted targets, the textbook way (fp32, ignore_index)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    ce = F.cross_entropy(logits[:, :-1].transpose(1, 2), batch["labels"][:, 1:], ignore_index=IGNORE,
                         reduction="none")
    return ce.sum(-1)


def test_loss_sum_is_the_weighted_sum_of_shifted_token_losses(model):
    task = get_task("causal-lm")
    batch = collate(rows(5, seed=1), weights=[1.0, 0.0, 1.0, 1.0, 0.0])  # two padding rows weigh 0
    with torch.no_grad():
        got = task.step.loss_sum(model(**{k: batch[k] for k in ("input_ids", "attention_mask")}), batch)
        want = (plain_token_losses(model, batch) * batch["loss_weight"]).sum()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("chunked", [False, True])
def test_forward_loss_is_the_plain_computation_with_and_without_the_chunked_layer(model, chunked):
    """Task.forward_loss (the step's one call) == the weighted sum of the textbook shifted token losses, value and
    gradients, through the plain logits and through the chunked output layer (3 tokens per chunk); it returns no
    outputs (the losses come from their own call, never through them); eval_outputs gives the same per-row sums."""
    import copy

    from leantrain.modeling.chunked_loss import install_chunked_loss

    task = get_task("causal-lm")
    batch = collate(rows(5, seed=6), weights=[1.0, 0.0, 1.0, 1.0, 0.5])
    plain, tried = copy.deepcopy(model), copy.deepcopy(model)
    if chunked:
        assert install_chunked_loss(tried, chunk_tokens=3)
    got, outputs = task.step.forward_loss(tried, batch)
    want = (plain_token_losses(plain, batch) * batch["loss_weight"]).sum()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    got.backward()
    want.backward()
    for (name, p), q in zip(tried.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert outputs is None
    with torch.no_grad():
        (per_row,) = task.evaluation.outputs(tried, batch)
        torch.testing.assert_close(per_row[:, 0].float(), plain_token_losses(plain, batch), rtol=1e-6, atol=1e-6)
        assert per_row[:, 1].tolist() == [float((r[1:] != IGNORE).sum()) for r in batch["labels"]]
        assert task.token_losses(tried, batch).shape == (5, batch["input_ids"].shape[1] - 1)


def test_count_sums_targets_of_real_rows():
    import datasets

    data = rows(9, seed=2)
    ds = datasets.Dataset.from_list(data)
    task = get_task("causal-lm")
    idx = [3, 0, 7, -1, -2]  # negative: padding indices (WeightedView), no targets
    want = sum(sum(1 for x in data[i]["labels"][1:] if x != IGNORE) for i in (3, 0, 7))
    assert task.data.count(ds, idx) == want
    assert task.data.count(ds, np.array([8])) == data[8]["targets"]
    assert task.traits.unit == "tokens"


def test_global_normalisation_over_micro_batches_with_different_targets(model):
    """sum of loss_sum over micro-batches / count of the global batch == the token mean of the whole batch, while
    the micro-batches hold very different numbers of targets (a mean of micro-batch means would differ)."""
    import datasets

    data = rows(8, seed=3)
    data[0]["labels"] = [IGNORE] * len(data[0]["labels"])  # a row with no target at all
    data[0]["targets"] = 0
    ds = datasets.Dataset.from_list(data)
    task = get_task("causal-lm")
    micro = [[0, 1], [2, 3, 4], [5, 6, 7]]
    with torch.no_grad():
        total = sum(task.step.loss_sum(model(**{k: b[k] for k in ("input_ids", "attention_mask")}), b)
                    for b in (collate([data[i] for i in m]) for m in micro))
        loss = total / task.data.count(ds, [i for m in micro for i in m])
        whole = collate(data)
        logits = model(input_ids=whole["input_ids"], attention_mask=whole["attention_mask"]).logits.float()
        want = F.cross_entropy(logits[:, :-1].transpose(1, 2), whole["labels"][:, 1:], ignore_index=IGNORE)
        means = [plain_token_losses(model, collate([data[i] for i in m])).sum()
                 / max(1, sum(data[i]["targets"] for i in m)) for m in micro]
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6)
    assert abs(float(sum(means) / len(means)) - float(want)) > 1e-4  # the mean of means is not it


def test_eval_loss_is_the_token_mean_over_uneven_batches(model):
    """engine.evaluate with batches of 3, 3, 1 rows: loss == the mean over every target token of the eval set,
    perplexity == exp(loss)."""
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from leantrain.engine.evaluation.evaluate import evaluate

    data = rows(7, seed=4)
    loader = DataLoader(data, batch_size=3, collate_fn=collate)
    task = get_task("causal-lm")
    metrics = evaluate(model, loader, Accelerator(cpu=True), 0, task, [])
    with torch.no_grad():
        sums = torch.cat([plain_token_losses(model, collate(data[i:i + 3])) for i in range(0, 7, 3)])
    tokens = sum(r["targets"] for r in data)
    assert metrics["tokens"] == tokens and metrics["samples"] == 7
    assert metrics["loss"] == pytest.approx(float(sums.double().sum()) / tokens, rel=1e-6)
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"]), rel=1e-12)


# ------------------------------------------------------------------------------------------------ model.task=auto


def _reason(*overrides):
    from leantrain.methods import resolve_task_reason

    task, why = resolve_task_reason(resolve(None, list(overrides)))
    return task.name, why


def test_auto_picks_causal_lm_and_says_why(tiny, tmp_path):
    tok, llama = tiny
    assert _reason(f"model.name={llama}", "data.train=x.jsonl") == ("causal-lm", "the model is a LlamaForCausalLM")
    task, why = _reason(*TINY_LLAMA, f"model.tokenizer={tok}", "data.train=x.jsonl")
    assert task == "causal-lm" and "model.config_type builds a llama causal LM" in why
    task, why = _reason(f"model.name={tok}", "model.config_type=llama", "data.train=corpus.txt")
    assert task == "causal-lm" and "plain text" in why
    assert _reason("data.train=corpus.txt")[0] == "causal-lm"
    # not a causal LM: labelled data, or a from-config model for classification (model.name names its tokenizer)
    assert _reason(f"model.name={llama}", "data.train=x.csv", "data.label_column=label")[0] == "text-classification"
    assert _reason(f"model.name={tok}", "model.config_type=llama", "data.train=x.csv")[0] == "text-classification"


def test_config_without_tokenizer_exits_2_naming_the_key(tmp_path):
    cfg = resolve(None, [*TINY_LLAMA, "model.task=causal-lm"])
    with pytest.raises(ConfigError, match="model.tokenizer is required with model.config_type") as e:
        get_task("causal-lm").model.check_keys(cfg.model)
    assert e.value.exit_code == 2
    get_task("text-classification").model.check_keys(cfg.model)  # a classifier takes model.name's tokenizer


def test_model_from_config_takes_the_tokenizers_vocabulary(tiny):
    from transformers import AutoTokenizer

    from leantrain.modeling import build_model

    tok = tiny[0]
    n = len(AutoTokenizer.from_pretrained(tok))
    cfg = resolve(None, [*TINY_LLAMA, f"model.tokenizer={tok}", "model.task=causal-lm"])
    model = build_model(cfg.model, [], get_task("causal-lm"))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == n and model.get_input_embeddings().num_embeddings == n
    assert model.config.eos_token_id == 1 and model.config.pad_token_id == 1  # pad = EOS (the tokenizer has none)
    bigger = resolve(None, [*TINY_LLAMA, f"model.tokenizer={tok}", "model.config_overrides.vocab_size=512"])
    assert build_model(bigger.model, [], get_task("causal-lm")).config.vocab_size == 512  # padded up: kept
    smaller = resolve(None, [*TINY_LLAMA, f"model.tokenizer={tok}", "model.config_overrides.vocab_size=8"])
    with pytest.raises(ConfigError, match="smaller than the tokenizer's vocabulary"):
        build_model(smaller.model, [], get_task("causal-lm"))


def test_block_size_within_the_models_position_limit(tiny):
    from leantrain.engine.setup.preflight import check_max_length

    tok = tiny[0]
    base = [*TINY_LLAMA, f"model.tokenizer={tok}", "model.task=causal-lm"]  # max_position_embeddings=256
    with pytest.raises(ConfigError, match="data.block_size=300 is more than the model takes.*at most 256"):
        check_max_length(resolve(None, [*base, "data.block_size=300"]))
    assert check_max_length(resolve(None, base)).data.block_size == 256  # the default 512, lowered
    assert check_max_length(resolve(None, [*base, "data.block_size=64"])).data.block_size == 64


def test_sample_prompts_are_for_language_models():
    from leantrain.engine.evaluation.samples import check_sample_prompts

    cfg = resolve(None, ['report.sample_prompts=["Once upon a time"]'])
    check_sample_prompts(cfg, get_task("causal-lm"))
    with pytest.raises(ConfigError, match="report.sample_prompts is for language models") as e:
        check_sample_prompts(cfg, get_task("text-classification"))
    assert e.value.exit_code == 2
    with pytest.raises(ConfigError, match=r"report.sample_prompts\[1\] is empty"):
        check_sample_prompts(resolve(None, ['report.sample_prompts=["a", " "]']), get_task("causal-lm"))
