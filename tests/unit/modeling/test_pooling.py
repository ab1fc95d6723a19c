"""model.pooling: auto detects an untrained BERT pooler (the packaged MiniLM's kind), logs it and does what the task
says (multi-label: cls; the others keep it, measured);
reinit re-initialises it, cls sets it to the identity; the saved model is a plain transformers model that
pipeline() loads with the same scores."""

from __future__ import annotations

import json

import pytest
import torch

from leantrain.cli import main
from tests.helpers import make_tiny_bert, write_rows


@pytest.fixture(scope="module")
def flat_bert(tmp_path_factory):
    """A tiny BERT whose pooler was never trained: weights shrunk to std ~0.004 (the MiniLM's is 0.009), so its
    output barely varies between inputs."""
    from transformers import BertModel

    folder = make_tiny_bert(tmp_path_factory.mktemp("flat-bert"))
    model = BertModel.from_pretrained(folder)
    with torch.no_grad():
        model.pooler.dense.weight.mul_(0.2)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def classifier(folder):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)


def test_detects_an_untrained_pooler_not_a_fresh_or_trained_one(flat_bert, tiny_bert):
    from leantrain.modeling.pooling import pooler_stats

    flat, fresh = pooler_stats(classifier(flat_bert)), pooler_stats(classifier(tiny_bert))
    assert flat.untrained and not fresh.untrained
    assert flat.weight_std < 0.006 and flat.output_ratio < fresh.output_ratio
    trained = classifier(tiny_bert)  # a trained-looking pooler: larger weights than a fresh layer's
    with torch.no_grad():
        trained.bert.pooler.dense.weight.mul_(3.0)
    assert not pooler_stats(trained).untrained


def test_choices_set_the_pooler(flat_bert):
    from leantrain.modeling.pooling import apply_pooling

    model = classifier(flat_bert)
    before = model.bert.pooler.dense.weight.clone()
    assert apply_pooling(model, "auto") == "pooler" and torch.equal(model.bert.pooler.dense.weight, before)
    assert apply_pooling(model, "reinit") == "reinit"
    after = model.bert.pooler.dense.weight
    assert not torch.equal(before, after) and after.std().item() == pytest.approx(0.02, rel=0.2)
    model = classifier(flat_bert)
    assert apply_pooling(model, "pooler") == "pooler" and torch.equal(model.bert.pooler.dense.weight, before)
    assert apply_pooling(model, "cls") == "cls"
    assert torch.equal(model.bert.pooler.dense.weight, torch.eye(32)) and not model.bert.pooler.dense.bias.any()
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    tiny = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=100, dim=16, n_layers=1, n_heads=2,
                                                                hidden_dim=32))
    assert apply_pooling(tiny, "auto") == "none"  # no BERT pooler: its own head


def test_auto_on_an_untrained_pooler_is_the_tasks_choice(flat_bert, tiny_bert):
    from leantrain.modeling import build_model
    from leantrain.config import ModelConfig
    from leantrain.methods import get_task

    assert get_task("multi-label").traits.untrained_pooler == "cls"
    assert {get_task(t).traits.untrained_pooler for t in ("text-classification", "text-regression")} == {"pooler"}
    ml = build_model(ModelConfig(name=str(flat_bert)), ["a", "b", "c"], get_task("multi-label"))
    assert torch.equal(ml.bert.pooler.dense.weight, torch.eye(32))  # auto, untrained-looking: cls
    single = build_model(ModelConfig(name=str(flat_bert)), ["a", "b"], get_task("text-classification"))
    assert not torch.equal(single.bert.pooler.dense.weight, torch.eye(32))  # kept
    fresh = build_model(ModelConfig(name=str(tiny_bert)), ["a", "b", "c"], get_task("multi-label"))
    assert not torch.equal(fresh.bert.pooler.dense.weight, torch.eye(32))  # a pooler that looks trained: kept


def test_trained_model_reloads_in_pipeline_with_the_same_scores(flat_bert, tmp_path, capsys):
    from transformers import pipeline

    from leantrain import train

    rows = [{"text": f"{'good fine' if i % 2 else 'bad awful'} {i}", "label": "pos" if i % 2 else "neg"}
            for i in range(24)]
    data = write_rows(tmp_path / "train.csv", rows)
    out = tmp_path / "run"
    train(None, [f"model.name={flat_bert}", f"data.train={data}", "train.batch_size=8", "train.epochs=1",
                 "model.pooling=reinit", "report.plots=false", "report.progress=none", "efficiency.precision=fp32",
                 f"output_dir={out}"])
    assert "pooling: reinit (model.pooling; pooler weight std 0.004" in capsys.readouterr().err
    from safetensors.torch import load_file

    saved = load_file(out / "model" / "model.safetensors")
    assert saved["bert.pooler.dense.weight"].std().item() > 0.01  # the re-initialised pooler is what was saved
    preds = tmp_path / "p.jsonl"
    assert main(["predict", str(out / "model"), "--input", str(data), "--output", str(preds)]) == 0
    mine = [json.loads(line) for line in preds.read_text().splitlines()]
    pipe = pipeline("text-classification", model=str(out / "model"))
    theirs = pipe([r["text"] for r in rows])
    assert [t["label"] for t in theirs] == [m["label"] for m in mine]
    assert [t["score"] for t in theirs] == pytest.approx([m["score"] for m in mine], abs=1e-5)
