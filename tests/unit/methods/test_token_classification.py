"""model.task=token-classification: word/sub-token alignment (first sub-token or all), the loss (CE summed over
labelled sub-tokens / their count), entity metrics against seqeval, CoNLL files and bad rows, the truncation
report, and a tiny BERT trained on JSONL tokens / ner_tags chosen by auto-detection, then predict, eval and
pipeline(aggregation_strategy="simple")."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from leantrain.cli import main
from leantrain.config import DataConfig, resolve
from leantrain.errors import DataError
from leantrain.config.tasks import TOKEN_CLASSIFICATION
from leantrain.methods import get_task
from tests.helpers import NER_TAGS as TAGS, ner_rows, tiny_run_args, write_jsonl


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ner")
    return write_jsonl(tmp / "train.jsonl", ner_rows(48, 0)), write_jsonl(tmp / "dev.jsonl", ner_rows(12, 1))


args = tiny_run_args


# ------------------------------------------------------------------------------------------------ alignment


def test_alignment_first_sub_token_and_all_sub_tokens(tiny_bert):
    from transformers import AutoTokenizer

    from leantrain.data.tagged import align, collator, process

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    import datasets

    rows = datasets.Dataset.from_dict({"tokens": [["Huggingface", "is", "in", "Brooklyn"]], "label": [[3, 0, 0, 3]]})
    ds = process(rows, tok, DataConfig(max_length=32), desc="Processing")
    ids = ds[0]["word_ids"]
    assert ids[0] == -1 and ids[-1] == -1  # [CLS], [SEP]
    assert ids.count(0) > 1  # "Huggingface" is split
    first = align(ids, [3, 0, 0, 3])
    every = align(ids, [3, 0, 0, 3], all_tokens=True)
    for p, w in enumerate(ids):
        starts = w >= 0 and (p == 0 or ids[p - 1] != w)
        assert first[p] == ([3, 0, 0, 3][w] if starts else -100)
        assert every[p] == ([3, 0, 0, 3][w] if w >= 0 else -100)
    assert ds[0]["n_first"] == 4 and ds[0]["n_all"] == sum(1 for w in ids if w >= 0)
    batch = collator(tok, DataConfig(label_all_tokens=True), train=True)([dict(ds[0])])
    assert batch["labels"][0].tolist() == every.tolist()
    evals = collator(tok, DataConfig(label_all_tokens=True), train=False)([dict(ds[0])])  # metrics: per word
    assert evals["labels"][0].tolist() == first.tolist()


# ------------------------------------------------------------------------------------------------ loss


def test_loss_is_ce_summed_over_labelled_tokens_over_their_count():
    from leantrain.methods import get_task

    task = get_task("token-classification")
    logits = torch.randn(3, 6, 5)
    labels = torch.tensor([[-100, 1, 2, -100, 0, -100], [-100, 3, 4, 0, -100, -100], [-100, 0, -100, -100, -100, -100]])
    out = type("Out", (), {"logits": logits})()
    total = task.step.loss_sum(out, {"labels": labels, "loss_weight": torch.tensor([1.0, 1.0, 0.0])})

    class Rows:  # a processed dataset's per-row counts
        _fingerprint = "rows-1"

        def __getitem__(self, col):
            return {"n_first": [3, 3, 1], "n_all": [4, 5, 2]}[col]

    count = task.data.count(Rows(), np.array([0, 1, -1 - 2]))  # the padding index (weight 0) is not counted
    assert count == 6
    ref = torch.nn.functional.cross_entropy(logits[:2].reshape(-1, 5), labels[:2].reshape(-1), ignore_index=-100,
                                            reduction="sum")
    assert torch.allclose(total, ref)
    assert torch.allclose(total / count, torch.nn.functional.cross_entropy(
        logits[:2].reshape(-1, 5), labels[:2].reshape(-1), ignore_index=-100))
    all_tokens = task.configured(resolve(None, ["data.label_all_tokens=true"]))
    assert all_tokens.data.count(Rows(), [0, 1, 2]) == 11


# ------------------------------------------------------------------------------------------------ metrics


def test_metrics_match_seqeval_strict():
    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    from leantrain.methods import get_task

    r = random.Random(3)
    gold = [[t for t in row["ner_tags"]] for row in ner_rows(30, 5)]
    pred = [[t if r.random() > 0.2 else r.choice(TAGS) for t in s] for s in gold]
    index = {n: i for i, n in enumerate(TAGS)}
    values = {"labels": np.array([index[t] for s in gold for t in s]), "preds": np.array([index[t] for s in pred for t in s]),
              "first": np.array([i == 0 for s in gold for i in range(len(s))]),
              "losses": np.ones(sum(map(len, gold)), dtype=np.float32)}
    ev = get_task("token-classification").evaluation.all_metrics(values, TAGS)
    kw = {"mode": "strict", "scheme": IOB2}
    assert ev["entity_f1"] == pytest.approx(f1_score(gold, pred, **kw))
    assert ev["entity_precision"] == pytest.approx(precision_score(gold, pred, **kw))
    assert ev["entity_recall"] == pytest.approx(recall_score(gold, pred, **kw))
    assert ev["token_accuracy"] == pytest.approx(np.mean([a == b for s, p in zip(gold, pred) for a, b in zip(s, p)]))
    report = classification_report(gold, pred, output_dict=True, **kw)
    assert ev["f1_per_entity"] == {k: pytest.approx(report[k]["f1-score"]) for k in ("LOC", "PER")}
    assert ev["samples"] == 30


def test_scheme_detection():
    from leantrain.methods.classify.token_classification import detect_scheme

    assert detect_scheme(["O", "B-PER", "I-PER"], [["B-PER", "I-PER", "O"]]) == "IOB2"
    assert detect_scheme(["O", "I-PER", "B-PER"], [["I-PER", "I-PER", "O"]]) == "IOB1"
    assert detect_scheme(["O", "B-PER", "L-PER", "U-LOC"]) == "BILOU"
    assert detect_scheme(["O", "B-PER", "E-PER", "S-LOC"]) == "IOBES"


# ------------------------------------------------------------------------------------------------ data


CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def test_conll_file_read_with_lines_and_auto_detected(tmp_path, tiny_bert):
    from leantrain.data.tagged import load_and_validate
    from leantrain.engine.setup.training_data import run_task

    f = tmp_path / "eng.train"  # no extension, like CoNLL-2003's files
    f.write_text(CONLL)
    data = load_and_validate(DataConfig(train=str(f), eval=str(f)), seed=0, batch_size=2)
    assert data.label_names == ["O", "B-MISC", "B-ORG", "B-PER", "I-PER"]
    assert data.train["tokens"] == [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
    assert data.train["label"] == [[2, 0, 1], [3, 4]]
    assert run_task(resolve(None, [f"model.name={tiny_bert}", f"data.train={f}"])).name == "token-classification"
    notes = tmp_path / "notes.txt"  # not CoNLL columns: auto leaves it to the text loader's message
    notes.write_text("hello\n")
    with pytest.raises(DataError, match="unsupported file type"):
        run_task(resolve(None, [f"model.name={tiny_bert}", f"data.train={notes}"]))
    bad = tmp_path / "bad.conll"
    bad.write_text(CONLL + "\nParis NNP B-NP B-LOC\n")  # a tag the training data lacks, on line 10
    with pytest.raises(DataError) as e:
        load_and_validate(DataConfig(train=str(f), eval=str(bad)), seed=0, batch_size=2)
    assert "bad.conll" in str(e.value) and "'B-LOC'" in str(e.value) and "line 10" in str(e.value)


def test_bad_rows_fail_naming_file_and_line(tmp_path):
    from leantrain.data.tagged import load_and_validate

    rows = ner_rows(6)
    rows[2] = {"tokens": ["a", "b"], "ner_tags": ["O"]}
    f = write_jsonl(tmp_path / "t.jsonl", rows)
    with pytest.raises(DataError) as e:
        load_and_validate(DataConfig(train=str(f)), seed=0, batch_size=2)
    assert "t.jsonl" in str(e.value) and "different lengths" in str(e.value) and "line 3" in str(e.value)
    ids = write_jsonl(tmp_path / "ids.jsonl", [{"tokens": ["a", "b"], "ner_tags": [0, 1]}] * 4)
    with pytest.raises(DataError, match="data.label_names"):
        load_and_validate(DataConfig(train=str(ids)), seed=0, batch_size=2)
    data = load_and_validate(DataConfig(train=str(ids), label_names=["O", "B-X"]), seed=0, batch_size=2)
    assert data.label_names == ["O", "B-X"] and data.train["label"][0] == [0, 1]
    out_of_range = write_jsonl(tmp_path / "r.jsonl", [{"tokens": ["a", "b"], "ner_tags": [0, 7]}] * 4)
    with pytest.raises(DataError, match="'7'.*r.jsonl|r.jsonl.*'7'"):
        load_and_validate(DataConfig(train=str(out_of_range), label_names=["O", "B-X"]), seed=0, batch_size=2)


def test_truncation_is_reported(tiny_bert, caplog):
    import datasets
    from transformers import AutoTokenizer

    from leantrain.data.tagged import process

    tok = AutoTokenizer.from_pretrained(tiny_bert)
    rows = datasets.Dataset.from_dict({"tokens": [["word"] * 20, ["short"]], "label": [[0] * 20, [0]]})
    with caplog.at_level("WARNING", logger="leantrain"):
        process(rows, tok, DataConfig(max_length=12), desc="Processing train")
    text = caplog.text
    assert "1 of 2 sentences are longer than data.max_length=12" in text and "10 of 21 words lost their labels" in text


# ------------------------------------------------------------------------------------------------ end to end


def test_jsonl_tokens_auto_detected_train_predict_eval_pipeline(tmp_path, tiny_bert, data, capsys):
    from transformers import pipeline

    from leantrain import train
    from leantrain.engine.setup.training_data import run_task

    assert run_task(resolve(None, args(tiny_bert, data, tmp_path / "x"))).name == "token-classification"
    out = tmp_path / "run"
    summary = train(None, args(tiny_bert, data, out, "checkpoint.best_metric=eval.entity_f1"))
    ev = summary["eval"]
    assert {"entity_f1", "entity_precision", "entity_recall", "token_accuracy", "loss"} <= set(ev)
    assert ev["samples"] == 12 and set(ev["f1_per_entity"]) <= {"PER", "LOC"}
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {str(i): n for i, n in enumerate(["O", "B-LOC", "B-PER", "I-LOC", "I-PER"])}
    assert config["architectures"] == ["BertForTokenClassification"]
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("f1_per_entity" in str(rec) for rec in logged)
    preds = tmp_path / "p.jsonl"
    assert main(["predict", str(out / "model"), "--input", str(data[1]), "--output", str(preds)]) == 0
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    source = [json.loads(line) for line in data[1].read_text().splitlines()]
    assert len(rows) == 12 and all(len(r["tags"]) == len(s["tokens"]) for r, s in zip(rows, source))
    for r in rows:
        for ent in r["entities"]:
            assert ent["entity"] in ("PER", "LOC") and 0 <= ent["start"] < ent["end"] <= len(r["tags"])
            assert ent["words"] == " ".join(r["tokens"][ent["start"]:ent["end"]])
    capsys.readouterr()
    assert main(["eval", str(out / "model"), f"data.eval={data[1]}"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["entity_f1"] == pytest.approx(ev["entity_f1"], abs=1e-6)
    assert shown["loss"] == pytest.approx(ev["loss"], rel=1e-4)
    pipe = pipeline("token-classification", model=str(out / "model"), aggregation_strategy="simple")
    got = pipe("Anna Smith went to Paris")
    assert all(g["entity_group"] in ("PER", "LOC") for g in got)


def test_a_ner_run_reports_examples_and_samples_per_second_and_keeps_the_loss(tmp_path, tiny_bert, data, capsys):
    """Token classification counts its loss in tokens but is no language model: its eval rows are examples (not
    "blocks"), its speed samples/s, and the final line keeps the loss its headline does not show."""
    out = tmp_path / "run"
    assert main(["train", *args(tiny_bert, data, out, "model.task=token-classification", "train.max_steps=2")]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["eval_row_kind"] == "examples"
    assert summary["train"]["speed_unit"] == "samples"
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("eval entity F1:") and f", loss {summary['eval']['loss']:.4f} on 12 examples" in line
    assert "blocks" not in line and "tokens/s" not in line and "samples/s" in line


def test_plan_calibrates_a_token_classifier(tiny_bert):
    """``leantrain plan``'s calibration passes take per-token logits (batch, length, labels)."""
    from transformers import AutoModelForTokenClassification

    from leantrain.perf import memory_model

    model = AutoModelForTokenClassification.from_pretrained(tiny_bert, num_labels=5)
    cal = memory_model.calibrate(model, 8, "fp32", False, 1, timing=False, task=get_task(TOKEN_CLASSIFICATION))
    assert cal is not None


def test_classlabel_tag_ids_bring_their_names(tmp_path):
    """A datasets folder whose tags are a sequence of ClassLabel ids (like the Hub's conll2003) needs no
    data.label_names."""
    import datasets

    from leantrain.data.tagged import load_and_validate

    names = ["O", "B-PER", "I-PER"]
    features = datasets.Features({"tokens": datasets.List(datasets.Value("string")),
                                  "ner_tags": datasets.List(datasets.ClassLabel(names=names))})
    ds = datasets.Dataset.from_dict({"tokens": [["Anna", "Smith", "ran"]] * 4, "ner_tags": [[1, 2, 0]] * 4},
                                    features=features)
    ds.save_to_disk(str(tmp_path / "ds"))
    data = load_and_validate(DataConfig(train=str(tmp_path / "ds")), seed=0, batch_size=2)
    assert data.label_names == names and data.train["label"][0] == [1, 2, 0]
