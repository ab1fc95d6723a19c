"""The built-in demo dataset: deterministic, balanced, no train/eval overlap, learnable but not trivial."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import Counter

import pytest

from leantrain.data import demo


def _read(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return demo.demo_files(tmp_path_factory.mktemp("cache"))


def test_deterministic_bytes(files, tmp_path):
    again = demo.demo_files(tmp_path)
    assert again[0].parent == tmp_path / f"demo-v{demo.VERSION}"
    for a, b in zip(files, again):
        assert a.read_bytes() == b.read_bytes()


def test_idempotent_and_env_default(tmp_path, monkeypatch):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path))
    train, _ = demo.demo_files()
    assert train.parent == tmp_path / f"demo-v{demo.VERSION}"
    mtime = train.stat().st_mtime_ns
    assert demo.demo_files()[0].stat().st_mtime_ns == mtime  # not rewritten
    assert not [p for p in train.parent.iterdir() if p.name.endswith(".tmp")]


def test_sizes_labels_balance_and_overlap(files):
    train, evals = (_read(p) for p in files)
    assert len(train) == demo.N_TRAIN == 1500 and len(evals) == demo.N_EVAL == 300
    assert list(train[0]) == ["text", "label"]
    for rows in (train, evals):
        counts = Counter(r["label"] for r in rows)
        assert set(counts) == {"negative", "neutral", "positive"}
        assert max(counts.values()) - min(counts.values()) <= 0.05 * len(rows)
        assert all(r["text"].strip() for r in rows)
    train_texts = {r["text"].lower() for r in train}
    assert len(train_texts) == len(train)
    assert not train_texts & {r["text"].lower() for r in evals}


def test_module_cli(tmp_path):
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "leantrain.data.demo", str(out)], check=True, capture_output=True)
    assert (out / "train.csv").read_bytes() == demo.write_demo(tmp_path / "ref")[0].read_bytes()
    assert (out / "eval.csv").is_file()


def test_bag_of_words_learns_it_but_not_perfectly(files):
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    train, evals = (_read(p) for p in files)
    vec = TfidfVectorizer()
    x_train = vec.fit_transform([r["text"] for r in train])
    clf = LogisticRegression(max_iter=1000).fit(x_train, [r["label"] for r in train])
    acc = clf.score(vec.transform([r["text"] for r in evals]), [r["label"] for r in evals])
    assert 0.6 < acc < 0.97, acc  # well above the majority rate (1/3); negations and contrasts keep it short of 1
