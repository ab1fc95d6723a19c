"""Continuing from a fine-tuned classifier: head rows follow the label names (model.reuse_head)."""

import pytest
import torch

from tests.helpers import write_rows
from leantrain import train
from leantrain.config import ModelConfig
from leantrain.engine.devices.accelerator import setup_logging
from leantrain.modeling.head_reuse import find_head, row_sources
from leantrain.methods import TEXT, get_task
from leantrain.modeling import build_model

TEXT_TASK = get_task(TEXT)

TEXTS = ["the cat sat", "a dog ran far", "birds sing at dawn", "rain on the roof", "quiet night here"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_bert):
    """A tiny classifier fine-tuned on labels a, b, c (sorted ids: a=0, b=1, c=2)."""
    tmp = tmp_path_factory.mktemp("head")
    rows = [{"text": f"{t} {lab}", "label": lab} for t in TEXTS for lab in "abc"]
    f = write_rows(tmp / "train.csv", rows)
    out = tmp / "run"
    train(None, [f"model.name={tiny_bert}", f"data.train={f}", f"data.eval={f}", "train.max_steps=2",
                 "train.batch_size=8", "train.lr=1e-2", "report.plots=false", "checkpoint.every_steps=0",
                 f"output_dir={out}"])
    return out / "model"


def _logits(model, tokenizer) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**tokenizer(TEXTS, return_tensors="pt", padding=True)).logits


def _by_name(model, tokenizer) -> dict[str, torch.Tensor]:
    logits = _logits(model, tokenizer)
    return {name: logits[:, i] for i, name in model.config.id2label.items()}


@pytest.fixture(scope="module")
def reference(trained):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(trained)
    model = AutoModelForSequenceClassification.from_pretrained(trained)
    assert list(model.config.id2label.values()) == ["a", "b", "c"]
    return tok, _by_name(model, tok)


def test_other_id_order_keeps_each_label_logits(trained, reference, tmp_path, capsys):
    """data.label_order=first_seen gives c=0, a=1, b=2: before any step, each label keeps its logits."""
    tok, before = reference
    rows = [{"text": f"{t} {lab}", "label": lab} for lab in "cab" for t in TEXTS]
    f = write_rows(tmp_path / "train.csv", rows)
    out = tmp_path / "cont"
    setup_logging(True)
    summary = train(None, [f"model.name={trained}", f"data.train={f}", f"data.eval={f}", "data.label_order=first_seen",
                           "train.max_steps=1", "train.lr=1e-9", "optim.name=sgd", "optim.momentum=0",
                           "optim.weight_decay=0", "train.batch_size=8", "report.plots=false",
                           "checkpoint.every_steps=0", f"output_dir={out}"])
    assert summary["model"]["labels"] == ["c", "a", "b"]
    assert "mapped by label name" in capsys.readouterr().err
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=str(trained)), ["c", "a", "b"], TEXT_TASK)
    after = _by_name(model, tok)
    assert list(model.config.id2label.values()) == ["c", "a", "b"]
    for name in "abc":
        torch.testing.assert_close(after[name], before[name])


def test_renamed_labels_start_a_fresh_head(trained, capsys):
    setup_logging(True)
    model = build_model(ModelConfig(name=str(trained)), ["x", "y", "z"], TEXT_TASK)
    err = capsys.readouterr().err
    assert "re-initialised" in err and "none of the model's labels" in err
    assert model.config.id2label == {0: "x", 1: "y", 2: "z"}


def test_integer_labels_hint_at_label_names():
    _, note = row_sources(["neg", "pos"], ["0", "1"], "auto")
    assert "re-initialised" in note and "data.label_names" in note


def test_new_label_gets_a_fresh_row(trained, reference):
    tok, before = reference
    model = build_model(ModelConfig(name=str(trained)), ["a", "b", "c", "d"], TEXT_TASK)
    after = _by_name(model, tok)
    assert model.config.num_labels == 4 and model.num_labels == 4
    for name in "abc":
        torch.testing.assert_close(after[name], before[name])
    _, note = row_sources(["a", "b", "c"], ["a", "b", "c", "d"], "auto")
    assert "new labels with freshly initialised rows: d" in note


def test_reuse_head_always_and_never(trained, reference):
    tok, before = reference
    by_position = _by_name(build_model(ModelConfig(name=str(trained), reuse_head="always"), ["c", "a", "b"], TEXT_TASK), tok)
    torch.testing.assert_close(by_position["c"], before["a"])  # row 0 stays row 0, whatever it is called
    _, note = row_sources(["a", "b", "c"], ["c", "a", "b"], "always")
    assert "although the label names differ" in note
    fresh = _by_name(build_model(ModelConfig(name=str(trained), reuse_head="never"), ["a", "b", "c"], TEXT_TASK), tok)
    assert not torch.allclose(fresh["a"], before["a"])


@pytest.mark.parametrize("kind,expected", [("bert", "classifier"), ("roberta", "classifier.out_proj"),
                                           ("gpt2", "score"), ("llama", "score")])
def test_find_head_generic(kind, expected):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    small = dict(bert=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16),
                 roberta=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16),
                 gpt2=dict(n_embd=16, n_layer=1, n_head=2),
                 llama=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                            num_key_value_heads=2))[kind]
    config = AutoConfig.for_model(kind, vocab_size=100, num_labels=3, pad_token_id=0, **small)
    model = AutoModelForSequenceClassification.from_config(config)
    name, _ = find_head(model, 3)
    assert name == expected
