"""predict / eval on a saved model reuse the run's settings (model/leantrain.json); predictions carry their input;
eval reports per class and writes a confusion matrix (issue 18, item 6)."""

import json
import random

import pytest

from tests.helpers import write_rows
from leantrain import train
from leantrain.cli import main

WORDS = {"pos": ["great", "lovely", "superb", "fine"], "neg": ["awful", "bad", "broken", "poor"],
         "meh": ["okay", "average", "plain", "so-so"]}


def _rows(n, seed=0):
    r = random.Random(seed)
    rows = []
    for i in range(n):
        lab = r.choice(sorted(WORDS))
        rows.append({"tweet_id": f"t{seed}-{i}", "body": " ".join(r.choice(WORDS[lab]) for _ in range(r.randint(1, 9))),
                     "mood": lab})
    return rows


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_bert):
    """A tiny run on columns auto-detection cannot find (body / mood), max_length 16."""
    tmp = tmp_path_factory.mktemp("pe")
    train_f, dev_f = write_rows(tmp / "train.csv", _rows(90)), write_rows(tmp / "dev.csv", _rows(30, seed=1))
    out = tmp / "run"
    train(None, [f"model.name={tiny_bert}", f"data.train={train_f}", f"data.eval={dev_f}", "data.text_column=body",
                 "data.label_column=mood", "data.max_length=16", "train.max_steps=4", "train.batch_size=16",
                 "train.lr=3e-3", "report.plots=false", "checkpoint.every_steps=0", f"output_dir={out}"])
    return out, dev_f


def test_run_settings_are_stored_with_the_model(run):
    out, _ = run
    stored = json.loads((out / "model" / "leantrain.json").read_text())
    assert stored["data"] == {"text_column": "body", "label_column": "mood", "max_length": 16}
    assert stored["task"] == "text-classification"


def test_predict_uses_the_run_columns_and_carries_the_text(run, tmp_path, capsys):
    out, dev_f = run
    preds = tmp_path / "p.jsonl"
    assert main(["predict", str(out / "model"), "--input", str(dev_f), "--output", str(preds)]) == 0
    err = capsys.readouterr().err
    assert "data.text_column='body'" in err and "data.max_length=16" in err
    lines = [json.loads(x) for x in preds.read_text().splitlines()]
    assert [x["text"] for x in lines] == [r["body"] for r in _rows(30, seed=1)]
    assert list(lines[0]) == ["row", "text", "label", "score"]
    with_ids = tmp_path / "q.jsonl"
    assert main(["predict", str(out / "model"), "--input", str(dev_f), "--output", str(with_ids),
                 "--id-column", "tweet_id"]) == 0
    ids = [json.loads(x) for x in with_ids.read_text().splitlines()]
    assert [x["id"] for x in ids] == [r["tweet_id"] for r in _rows(30, seed=1)]
    assert [x["label"] for x in ids] == [x["label"] for x in lines]


def test_predict_user_override_wins(run, tmp_path, capsys):
    out, dev_f = run
    assert main(["predict", str(out / "model"), "--input", str(dev_f), "--output", str(tmp_path / "p.jsonl"),
                 "data.text_column=tweet_id"]) == 0
    first = json.loads((tmp_path / "p.jsonl").read_text().splitlines()[0])
    assert first["text"] == "t1-0"


def test_predict_bad_id_column_is_exit_2(run, tmp_path, capsys):
    out, dev_f = run
    assert main(["predict", str(out / "model"), "--input", str(dev_f), "--output", str(tmp_path / "p.jsonl"),
                 "--id-column", "nope"]) == 2
    assert "--id-column 'nope'" in capsys.readouterr().err


def test_eval_per_class_and_confusion_matrix(run, tmp_path, capsys):
    out, dev_f = run
    assert main(["eval", str(out / "model"), f"data.eval={dev_f}", "--output", str(tmp_path / "m.json")]) == 0
    printed = capsys.readouterr().out
    assert "precision" in printed and "recall" in printed and "meh" in printed
    result = json.loads((tmp_path / "m.json").read_text())
    per_class = result["eval"]["per_class"]
    assert list(per_class) == ["meh", "neg", "pos"] and sum(c["support"] for c in per_class.values()) == 30
    cm = json.loads((tmp_path / "m.confusion.json").read_text())
    assert cm["labels"] == ["meh", "neg", "pos"] and sum(map(sum, cm["matrix"])) == 30
    assert (tmp_path / "m.confusion.png").stat().st_size > 1000
    assert main(["eval", str(out / "model"), f"data.eval={dev_f}"]) == 0  # no --output: into the run folder
    assert (out / "eval_confusion.json").is_file() and (out / "eval_confusion.png").is_file()


def test_eval_takes_the_first_max_eval_samples_rows(run, tmp_path):
    """data.max_eval_samples cuts leantrain eval's rows as it cuts a run's eval set (it was ignored here)."""
    out, dev_f = run
    assert main(["eval", str(out / "model"), f"data.eval={dev_f}", "data.max_eval_samples=7",
                 "--output", str(tmp_path / "m.json")]) == 0
    per_class = json.loads((tmp_path / "m.json").read_text())["eval"]["per_class"]
    assert sum(c["support"] for c in per_class.values()) == 7
