"""model.task=multi-label: list labels (JSONL) auto-detected, delimited strings with data.label_separator, BCE
summed over labels / (examples x labels), micro / macro F1 and subset accuracy, predict and pipeline(top_k=None)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from leantrain.cli import main
from leantrain.config import resolve
from tests.helpers import EMOTIONS, set_rows, tiny_run_args, write_jsonl, write_rows


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ml")
    return write_jsonl(tmp / "train.jsonl", set_rows(48, 0)), write_jsonl(tmp / "dev.jsonl", set_rows(12, 1))


args = tiny_run_args


def test_loss_is_bce_summed_over_examples_x_labels():
    from leantrain.methods import get_task

    task = get_task("multi-label")
    logits, targets = torch.randn(5, 4), (torch.rand(5, 4) > 0.5).float()
    out = type("Out", (), {"logits": logits})()
    total = task.step.loss_sum(out, {"labels": targets, "loss_weight": torch.ones(5)})
    n_l = task.data.count(_Rows(5, 4), range(5))
    assert n_l == 20
    ref = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="sum") / 20
    assert torch.allclose(total / n_l, ref)
    weight = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])  # a padding example counts nothing
    assert torch.allclose(task.step.loss_sum(out, {"labels": targets, "loss_weight": weight}),
                          torch.nn.functional.binary_cross_entropy_with_logits(logits[:4], targets[:4],
                                                                               reduction="sum"))
    assert task.data.count(_Rows(5, 4), [0, 1, -3]) == 8


class _Rows:
    """A processed dataset's row access: row i has a multi-hot ``labels`` of ``width``."""

    def __init__(self, n, width):
        self.n, self.width = n, width

    def __getitem__(self, i):
        return {"labels": [0.0] * self.width}


def test_metrics_match_sklearn():
    from sklearn.metrics import accuracy_score, f1_score

    from leantrain.config.metric_names import metric_names
    from leantrain.methods.classify.multilabel import multilabel_metrics

    rng = np.random.default_rng(0)
    probs, labels = rng.random((30, 4)), (rng.random((30, 4)) > 0.6).astype(np.float32)
    losses = rng.random((30, 4))
    m = multilabel_metrics(probs, labels, losses)
    preds = (probs > 0.5).astype(int)
    assert m["f1_micro"] == pytest.approx(f1_score(labels, preds, average="micro"))
    assert m["f1_macro"] == pytest.approx(f1_score(labels, preds, average="macro", zero_division=0))
    assert m["subset_accuracy"] == pytest.approx(accuracy_score(labels, preds))
    assert m["loss"] == pytest.approx(losses.mean()) and m["samples"] == 30
    assert [k for k in m if k != "samples"] == list(metric_names(None, "multi-label"))
    from leantrain.methods import get_task  # eval.threshold reaches the task's metrics

    task = get_task("multi-label").configured(resolve(None, ["eval.threshold=0.3"]))
    low = task.evaluation.metrics({"probs": probs, "labels": labels, "losses": losses}, 4)
    assert low["f1_micro"] == pytest.approx(f1_score(labels, (probs > 0.3).astype(int), average="micro"))


def test_list_labels_choose_multilabel_train_predict_pipeline(tmp_path, tiny_bert, data, capsys):
    from transformers import pipeline

    from leantrain import train
    from leantrain.engine.setup.training_data import run_task

    assert run_task(resolve(None, args(tiny_bert, data, tmp_path / "x"))).name == "multi-label"
    out = tmp_path / "run"
    summary = train(None, args(tiny_bert, data, out, "checkpoint.best_metric=eval.f1_micro"))
    ev = summary["eval"]
    assert {"f1_micro", "f1_macro", "subset_accuracy", "loss", "samples"} <= set(ev) and ev["samples"] == 12
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["problem_type"] == "multi_label_classification"
    assert config["id2label"] == {str(i): n for i, n in enumerate(EMOTIONS)}
    preds = tmp_path / "p.jsonl"
    assert main(["predict", str(out / "model"), "--input", str(data[1]), "--output", str(preds)]) == 0
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(rows) == 12 and set(rows[0]["scores"]) == set(EMOTIONS)
    assert config["threshold"] == ev["threshold"]  # eval.tune_threshold (default): stored, and predict uses it
    assert rows[0]["labels"] == [n for n in EMOTIONS if rows[0]["scores"][n] > config["threshold"]]
    high = tmp_path / "high.jsonl"  # eval.threshold, set, decides which labels predict writes
    assert main(["predict", str(out / "model"), "--input", str(data[1]), "--output", str(high),
                 "eval.threshold=0.6"]) == 0
    first = json.loads(high.read_text().splitlines()[0])
    assert first["labels"] == [n for n in EMOTIONS if first["scores"][n] > 0.6]
    capsys.readouterr()
    assert main(["eval", str(out / "model"), f"data.eval={data[1]}"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["f1_micro"] == pytest.approx(ev["f1_micro"], abs=1e-6)
    assert shown["loss"] == pytest.approx(ev["loss"], rel=1e-4)
    pipe = pipeline("text-classification", model=str(out / "model"), top_k=None)
    got = {d["label"]: d["score"] for d in pipe([rows[0]["text"]])[0]}
    assert set(got) == set(EMOTIONS)
    for name in EMOTIONS:  # sigmoid scores (they need not sum to 1)
        assert got[name] == pytest.approx(rows[0]["scores"][name], abs=1e-4)


def test_separator_strings(tmp_path, tiny_bert):
    from leantrain.config import DataConfig
    from leantrain.data.text_loader import load_and_validate
    from leantrain.engine.setup.training_data import run_task

    rows = [{"text": r["text"], "label": ",".join(r["labels"])} for r in set_rows(40, 2)]
    f = write_rows(tmp_path / "train.csv", rows)
    data = load_and_validate(DataConfig(train=str(f), label_separator=","), seed=0, batch_size=8,
                             labels="label_sets")
    assert data.label_names == EMOTIONS
    first = data.train[0]
    assert first["label"] == [float(n in rows_of(data, rows, first)) for n in EMOTIONS]
    assert run_task(resolve(None, [f"model.name={tiny_bert}", f"data.train={f}", "data.label_separator=,"])
                    ).name == "multi-label"


def rows_of(data, rows, first):
    """The label names of the source row whose text is ``first``'s."""
    return next(r["label"].split(",") for r in rows if r["text"] == first["text"])


def test_eval_names_the_training_data_lacks_are_refused_with_the_file(tmp_path):
    from leantrain.config import DataConfig
    from leantrain.data.text_loader import load_and_validate
    from leantrain.errors import DataError

    train_f = write_jsonl(tmp_path / "train.jsonl", set_rows(20, 0))
    dev_f = write_jsonl(tmp_path / "dev.jsonl", [{"text": "x", "labels": ["joy", "surprise"]}])
    with pytest.raises(DataError, match=r"dev.jsonl.*'surprise'"):
        load_and_validate(DataConfig(train=str(train_f), eval=str(dev_f)), seed=0, batch_size=8, labels="label_sets")


def test_stop_when_on_a_multilabel_metric(tiny_bert, data):
    from leantrain.engine.setup.training_data import check_stop_when
    from leantrain.errors import ConfigError

    check_stop_when(resolve(None, args(tiny_bert, data, "unused", "train.stop_when=eval.subset_accuracy>=0.9")), 4)
    with pytest.raises(ConfigError, match="eval.f1_micro"):
        check_stop_when(resolve(None, args(tiny_bert, data, "unused", "train.stop_when=eval.accuracy>=0.9")), 4)


def test_problem_type_override_points_to_the_task(capsys):
    assert main(["train", "--print-config", "model.config_overrides.problem_type=multi_label_classification"]) == 2
    assert "model.task=multi-label" in capsys.readouterr().err
    assert main(["train", "--print-config", "model.task=multi-label",
                 "model.config_overrides.problem_type=multi_label_classification"]) == 0


# ------------------------------------------------ 0/1 columns, pos_weight, threshold tuning, per-label F1 (issue 14)


def test_count_holds_the_label_count_and_reads_no_row():
    from leantrain.methods import get_task

    class NoRows:
        def __getitem__(self, i):
            raise AssertionError("count read a row")

    task = get_task("multi-label").configured(resolve(None, [])).data.for_training(lambda: None, EMOTIONS)
    assert task.data.count(NoRows(), [0, 1, 2, -1]) == 3 * len(EMOTIONS)


def test_pos_weight_loss_is_torch_bce_with_pos_weight_over_examples_x_labels():
    from leantrain.methods import get_task

    logits, targets = torch.randn(6, 4), (torch.rand(6, 4) > 0.5).float()
    out = type("Out", (), {"logits": logits})()
    w = [1.0, 2.5, 0.5, 4.0]
    task = get_task("multi-label").configured(resolve(None, [f"train.pos_weight={w}"])).data.for_training(
        lambda: None, EMOTIONS)
    loss = task.step.loss_sum(out, {"labels": targets, "loss_weight": torch.ones(6)}) / task.data.count(None, range(6))
    ref = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor(w))(logits, targets)  # mean over examples x labels
    assert torch.allclose(loss, ref)
    assert task.report.summary(EMOTIONS)["pos_weight"] == [{"label": n, "weight": x} for n, x in zip(EMOTIONS, w)]
    plain = get_task("multi-label").configured(resolve(None, [])).data.for_training(lambda: None, EMOTIONS)
    assert plain.report.summary(EMOTIONS) == {"pos_weight": None}


def test_pos_weight_forms_and_errors():
    from leantrain.errors import ConfigError, DataError
    from leantrain.methods.classify.multilabel import resolve_pos_weight

    hot = np.array([[1, 0, 1], [1, 0, 0], [0, 1, 0], [1, 0, 0]], dtype=np.float32)
    assert resolve_pos_weight("balanced", ["a", "b", "c"], hot) == [1 / 3, 3.0, 3.0]  # negatives / positives
    assert resolve_pos_weight(2, ["a", "b", "c"], hot) == [2.0, 2.0, 2.0]
    assert resolve_pos_weight(None, ["a", "b", "c"], hot) is None
    with pytest.raises(ConfigError, match="2 weights but the data has 3 labels"):
        resolve_pos_weight([1.0, 2.0], ["a", "b", "c"], hot)
    with pytest.raises(DataError, match="no positive training example of label c"):
        resolve_pos_weight("balanced", ["a", "b", "c"], hot[:, [0, 1, 1]] * [1, 1, 0])
    with pytest.raises(ConfigError, match="positive finite"):
        resolve(None, ["train.pos_weight=-1"])


def test_tuned_threshold_maximises_micro_f1_and_per_label_f1():
    from sklearn.metrics import f1_score

    from leantrain.methods import get_task
    from leantrain.methods.classify.multilabel import CANDIDATES

    rng = np.random.default_rng(1)
    labels = (rng.random((40, 4)) > 0.7).astype(np.float32)
    probs = np.clip(0.25 * labels + 0.3 * rng.random((40, 4)), 0, 1)  # scores under 0.5: 0.5 predicts nothing
    values = {"probs": probs, "labels": labels, "losses": rng.random((40, 4))}
    task = get_task("multi-label").configured(resolve(None, []))  # eval.tune_threshold: on by default
    m = task.evaluation.all_metrics(values, EMOTIONS)
    best = max(f1_score(labels, probs > t, average="micro") for t in CANDIDATES)
    assert m["f1_micro"] == pytest.approx(best) and m["f1_micro"] > m["f1_micro_untuned"]
    assert m["f1_micro"] == pytest.approx(f1_score(labels, probs > m["threshold"], average="micro"))
    per_label = f1_score(labels, probs > m["threshold"], average=None, zero_division=0)
    assert m["f1_per_label"] == {n: pytest.approx(f) for n, f in zip(EMOTIONS, per_label)}
    assert task.report.saved_config(m) == {"threshold": m["threshold"]}
    fixed = get_task("multi-label").configured(resolve(None, ["eval.tune_threshold=false"]))
    assert "threshold" not in fixed.evaluation.metrics(values, 4) and fixed.report.saved_config(m) == {}
    stored = type("C", (), {"threshold": 0.2})()  # a trained model's config: its threshold, no tuning
    assert get_task("multi-label").configured(resolve(None, []), stored).threshold == 0.2
    assert not get_task("multi-label").configured(resolve(None, []), stored).tune
    assert get_task("multi-label").configured(resolve(None, ["eval.threshold=0.7"]), stored).threshold == 0.7


def column_rows(n: int, seed: int) -> list[dict]:
    """The emotion rows with the labels as four 0/1 columns."""
    return [{"text": r["text"], **{e: int(e in r["labels"]) for e in ("sadness", "joy", "love", "anger")}}
            for r in set_rows(n, seed)]


def test_zero_one_columns_pos_weight_threshold_in_model_and_predict(tmp_path, tiny_bert, capsys):
    from leantrain import train

    order = ["sadness", "joy", "love", "anger"]  # the listed order, not the alphabet's
    train_f = write_jsonl(tmp_path / "train.jsonl", column_rows(48, 0))
    dev_f = write_jsonl(tmp_path / "dev.jsonl", column_rows(12, 1))
    out = tmp_path / "run"
    summary = train(None, args(tiny_bert, (train_f, dev_f), out, f"data.label_column=[{','.join(order)}]",
                               "train.pos_weight=balanced"))
    assert summary["model"]["labels"] == order and summary["data"]["columns"]["label"] == order
    hot = np.array([[r[e] for e in order] for r in column_rows(48, 0)], dtype=np.float64)
    expected = (len(hot) - hot.sum(0)) / hot.sum(0)
    assert [w["label"] for w in summary["train"]["pos_weight"]] == order
    assert [w["weight"] for w in summary["train"]["pos_weight"]] == pytest.approx(expected)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {str(i): n for i, n in enumerate(order)}
    assert config["threshold"] == summary["eval"]["threshold"]
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if "eval.f1_per_label" in r][-1]
    assert set(last["eval.f1_per_label"]) == set(order)
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"text": r["text"]} for r in column_rows(5, 2)])
    preds = tmp_path / "p.jsonl"  # an input without the 0/1 columns
    assert main(["predict", str(out / "model"), "--input", str(plain), "--output", str(preds)]) == 0
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(rows) == 5 and all(r["labels"] == [n for n in order if r["scores"][n] > config["threshold"]]
                                  for r in rows)
    capsys.readouterr()
    assert main(["eval", str(out / "model"), f"data.eval={dev_f}"]) == 0  # the 0/1 columns from leantrain.json
    assert json.loads(capsys.readouterr().out)["f1_micro"] == pytest.approx(summary["eval"]["f1_micro"], abs=1e-6)


def test_zero_one_columns_problems_name_file_and_row(tmp_path):
    from leantrain.errors import DataError
    from leantrain.engine.setup.training_data import run_task, validate_data

    rows = column_rows(20, 0)
    rows[3]["joy"] = 2
    bad = write_jsonl(tmp_path / "bad.jsonl", rows)
    cfg = resolve(None, [f"data.train={bad}", "data.label_column=[sadness,joy,nope]"])
    assert run_task(cfg).name == "multi-label"
    with pytest.raises(DataError) as e:
        validate_data(cfg)
    text = str(e.value) + " ".join(getattr(e.value, "problems", []))
    assert "no column 'nope'" in text and "'joy' is not 0 or 1" in text and "line 4" in text
    with pytest.raises(DataError, match="model.task=multi-label"):
        validate_data(resolve(None, [f"data.train={bad}", "data.label_column=[sadness,joy]",
                                     "model.task=text-classification"]))
    with pytest.raises(Exception, match="pos_weight is for multi-label"):
        validate_data(resolve(None, [f"data.train={bad}", "data.label_column=sadness", "train.pos_weight=2"]))
