"""Efficiency switches change how a step is computed, never what it computes: each is checked against the plain run."""

import random

import pytest
import torch
from safetensors.torch import load_file

from conftest import write_rows
from leantrain import train
from leantrain.config import resolve
from leantrain.engine.setup import step_plan
from leantrain.errors import ConfigError

WORDS = {"pos": ["great", "lovely", "superb", "fine"], "neg": ["awful", "bad", "broken", "poor"]}


def rows(n, seed=0):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        lab = r.choice(["pos", "neg"])
        out.append({"text": " ".join(r.choice(WORDS[lab]) for _ in range(r.randint(1, 30))), "label": lab})
    return out  # uneven lengths: 3 to 32 tokens


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eff-data")
    return write_rows(tmp / "train.csv", rows(96)), write_rows(tmp / "dev.csv", rows(16, seed=1))


def run(tmp_path, tiny_bert, data, name, *overrides):
    out = tmp_path / name
    summary = train(None, [f"model.name={tiny_bert}", f"data.train={data[0]}", f"data.eval={data[1]}",
                           "train.epochs=1", "train.batch_size=32", "train.lr=1e-3", "report.plots=false",
                           "efficiency.precision=fp32", f"output_dir={out}", *overrides])
    return summary, load_file(out / "model" / "model.safetensors")


def assert_same_params(a, b, rtol=1e-5, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=k)


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tiny_bert, data):
    return run(tmp_path_factory.mktemp("plain"), tiny_bert, data, "plain", "train.micro_batch_size=32")


def test_accumulation_run_equals_one_big_batch(tmp_path, tiny_bert, data, plain):
    summary, params = run(tmp_path, tiny_bert, data, "acc", "train.micro_batch_size=8")
    assert summary["train"]["accumulation_steps"] == 4 and plain[0]["train"]["accumulation_steps"] == 1
    assert summary["train"]["steps"] == 3
    assert_same_params(params, plain[1])


def test_the_runs_do_train(tiny_bert, plain):
    from transformers import AutoModel

    base = AutoModel.from_pretrained(tiny_bert).state_dict()
    moved = [k for k, v in base.items() if f"bert.{k}" in plain[1] and not torch.equal(v, plain[1][f"bert.{k}"])]
    assert len(moved) > 10  # the equivalence above is not two untouched models


def test_micro_batch_that_does_not_divide_says_what_would():
    cfg = resolve(None, ["train.batch_size=48", "train.micro_batch_size=16"])  # 24 per process over 2
    with pytest.raises(ConfigError, match=r"use train.micro_batch_size=12, or train.batch_size=64"):
        step_plan(cfg, 100, world_size=2)
