"""Checkpoint files without pickle, the manifest, the config comparison, best model / early stopping, NaN policy."""

from __future__ import annotations

import json
import math
import pickle

import pytest
import torch

from tests.helpers import word_rows, write_rows
from leantrain.cli import main
from leantrain.engine.checkpoint.save import complete_checkpoints, verify
from leantrain.engine.checkpoint.resume import config_diff
from leantrain.engine.checkpoint.state_io import StateFormatError, load_state, save_state
from leantrain.report.logs import read_metrics


class _Boom:
    """Unpickling this creates a marker file: proof that something unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_optimizer_and_rng_state_roundtrip_bitwise(tmp_path):
    import random

    import numpy as np

    from leantrain.engine.training.loop_state import rng_state, set_rng_state

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.9))
    model(torch.randn(5, 4)).sum().backward()
    opt.step()
    save_state(opt.state_dict(), tmp_path, "optimizer")
    fresh = torch.optim.AdamW(model.parameters(), lr=5.0)
    fresh.load_state_dict(load_state(tmp_path, "optimizer"))
    a, b = opt.state_dict(), fresh.state_dict()
    assert a["param_groups"] == b["param_groups"] and b["param_groups"][0]["betas"] == (0.8, 0.9)
    for i in a["state"]:
        for k in a["state"][i]:
            assert torch.equal(a["state"][i][k], b["state"][i][k]), (i, k)

    save_state(rng_state(), tmp_path, "rng")
    draws = (random.random(), np.random.rand(), torch.rand(3))
    set_rng_state(load_state(tmp_path, "rng"))
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert draws[:2] == again[:2] and torch.equal(draws[2], again[2])


def test_no_load_path_unpickles(tmp_path):
    marker = tmp_path / "unpickled"
    save_state({"x": torch.ones(2), "n": 1}, tmp_path, "s")
    payload = pickle.dumps(_Boom(marker))
    for name in ("s.safetensors", "s.json"):
        original = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(payload)
        with pytest.raises(StateFormatError, match="not a"):
            load_state(tmp_path, "s")
        (tmp_path / name).write_bytes(original)
    assert load_state(tmp_path, "s")["n"] == 1
    with pytest.raises(TypeError, match="without pickle"):
        save_state({"f": object()}, tmp_path, "bad")
    assert not marker.exists()


def test_pickled_checkpoint_file_refused_even_with_a_matching_manifest(tmp_path, tiny_bert, capsys):
    """A whole checkpoint whose model / optimizer file is replaced by a pickle payload and whose manifest is
    updated to match: resuming from it exits 2 and nothing is unpickled."""
    from leantrain.files import sha256_file as sha256

    args = _tiny_args(tmp_path, tiny_bert, "train.max_steps=2", "checkpoint.every_steps=1")
    assert main(["train", *args, f"output_dir={tmp_path / 'run'}"]) == 0
    ckpt = complete_checkpoints(tmp_path / "run")[0]
    marker = tmp_path / "unpickled"
    for name in ("model.safetensors", "optimizer.safetensors", "trainer_state.json"):
        original = (ckpt / name).read_bytes()
        (ckpt / name).write_bytes(pickle.dumps(_Boom(marker)))
        manifest = json.loads((ckpt / "manifest.json").read_text())
        manifest["files"][name] = sha256(ckpt / name)
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
        assert main(["train", *args, f"checkpoint.resume={ckpt}", f"output_dir={tmp_path / 'o'}"]) == 2, name
        err = capsys.readouterr().err
        assert f"{name}: not a" in err and ("safetensors" in err or "JSON" in err), err
        (ckpt / name).write_bytes(original)
        manifest["files"][name] = sha256(ckpt / name)
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
    assert not marker.exists()
    verify(ckpt)


def test_half_written_checkpoints_are_never_listed(tmp_path):
    root = tmp_path / "checkpoints"
    for name in ("step-0000002", ".tmp-step-0000004", "step-0000006"):
        (root / name).mkdir(parents=True)
    (root / "step-0000002" / "manifest.json").write_text(json.dumps({"files": {}}))
    (root / ".tmp-step-0000004" / "manifest.json").write_text(json.dumps({"files": {}}))
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["step-0000002"]  # step 6 has no manifest
    (root / "step-0000002" / "manifest.json").write_text(json.dumps({"files": {"model.safetensors": "0" * 64}}))
    with pytest.raises(ValueError, match="missing"):
        verify(root / "step-0000002")


def test_config_diff_ignores_cadence_and_flags_inexact_keys():
    from leantrain.config import resolve

    base = resolve(None, []).to_dict()
    other = resolve(None, ["train.log_every_steps=1", "report.plots=false", "data.num_workers=3", "output_dir=x",
                           "checkpoint.keep=9", "train.batch_size=64", "optim.weight_decay=0.5"]).to_dict()
    blocking, inexact = config_diff(base, other)
    assert blocking == ["optim.weight_decay: 0.01 -> 0.5"]
    assert len(inexact) == 1 and inexact[0].startswith("train.batch_size: 32 -> 64")


def test_a_checkpoint_from_before_compile_auto_resumes_but_compile_on_does_not():
    from leantrain.config import resolve

    now = resolve(None, []).to_dict()
    old = resolve(None, ["efficiency.compile=false"]).to_dict()
    assert now["efficiency"]["compile"] == "auto"
    assert config_diff(old, now) == ([], [])
    on = resolve(None, ["efficiency.compile=true"]).to_dict()
    assert config_diff(old, on)[0] == ["efficiency.compile: False -> True"]


def test_config_keys_need_best_metric():
    from leantrain.config import resolve
    from leantrain.errors import ConfigError

    with pytest.raises(ConfigError, match="needs checkpoint.best_metric"):
        resolve(None, ["checkpoint.save_model=best"])
    with pytest.raises(ConfigError, match="eval.f1_macro"):
        resolve(None, ["checkpoint.best_metric=f1"])


# ------------------------------------------------------------------------------------------ in-process runs


def _tiny_args(tmp_path, tiny_bert, *extra):
    if not (tmp_path / "train.csv").exists():
        write_rows(tmp_path / "train.csv", word_rows(32, 0, max_words=10))
        write_rows(tmp_path / "dev.csv", word_rows(8, 1, max_words=10))
    return [f"model.name={tiny_bert}", f"data.train={tmp_path / 'train.csv'}", f"data.eval={tmp_path / 'dev.csv'}",
            "train.batch_size=8", "train.lr=3e-3", "report.plots=false", "report.progress=none", *extra]


def test_nan_abort_names_step_and_batch_and_keeps_last_finite_checkpoint(tmp_path, tiny_bert, monkeypatch, capsys):
    from safetensors.torch import load_file

    monkeypatch.setenv("LEANTRAIN_TEST_NAN_AT_STEP", "3")
    out = tmp_path / "run"
    code = main(["train", *_tiny_args(tmp_path, tiny_bert, "train.max_steps=6", "train.log_every_steps=2",
                                      "checkpoint.every_steps=2", f"output_dir={out}")])
    assert code == 3
    err = capsys.readouterr().err
    assert "optimizer step 3" in err and "step-0000002" in err
    diag = json.loads((out / "nonfinite.json").read_text())
    assert diag["step"] == 3 and diag["ranks"] == [0] and len(diag["batch"]) == 8
    assert diag["last_finite_checkpoint"].endswith("step-0000002")
    assert [p.name for p in complete_checkpoints(out)] == ["step-0000002"]  # nothing saved after the NaN
    params = load_file(str(out / "checkpoints" / "step-0000002" / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in params.values())
    assert not (out / "summary.json").exists()
    # fused AdamW skipped the updates of steps 3 and 4 on the device (no host sync): the diagnostic checkpoint
    # written at the abort is exactly the state after step 2, optimizer included
    diag_dir = out / "nonfinite-state"
    assert diag["diagnostic_checkpoint"] == str(diag_dir) and "nonfinite-state" in err
    frozen = load_file(str(diag_dir / "model.safetensors"))
    assert frozen.keys() == params.keys() and all(torch.equal(frozen[k], params[k]) for k in params)
    opt_now, opt_ckpt = (load_file(str(d / "optimizer.safetensors"))
                         for d in (diag_dir, out / "checkpoints" / "step-0000002"))
    assert opt_now.keys() == opt_ckpt.keys() and all(torch.equal(opt_now[k], opt_ckpt[k]) for k in opt_ckpt)


def test_nan_skip_step_skips_the_update_only(tmp_path, tiny_bert, monkeypatch):
    from leantrain import train

    monkeypatch.setenv("LEANTRAIN_TEST_NAN_AT_STEP", "3")
    out = tmp_path / "run"
    summary = train(None, _tiny_args(tmp_path, tiny_bert, "train.max_steps=5", "train.log_every_steps=1",
                                     "train.nonfinite=skip_step", "checkpoint.every_steps=0", f"output_dir={out}"))
    assert summary["train"]["skipped_steps"] == [3]
    records = read_metrics(out / "metrics.jsonl")
    skipped = [r for r in records if r["type"] == "nonfinite"]
    assert [r["step"] for r in skipped] == [3] and len(skipped[0]["batch"]) == 8
    losses = {r["step"]: r["loss"] for r in records if r["type"] == "train"}
    assert losses[3] == "nan" and all(isinstance(losses[s], float) for s in (1, 2, 4, 5))
    assert math.isfinite(summary["eval"]["loss"])  # the skipped update kept the parameters finite


def test_best_model_and_early_stopping(tmp_path, tiny_bert):
    from safetensors.torch import load_file

    from leantrain import train

    out = tmp_path / "run"
    summary = train(None, _tiny_args(tmp_path, tiny_bert, "train.epochs=10", "train.lr=1e-2",
                                     "train.eval_every_steps=1", "train.log_every_steps=4",
                                     "checkpoint.best_metric=eval.loss", "train.early_stopping_patience=2",
                                     "checkpoint.save_model=best", "checkpoint.every_steps=0", f"output_dir={out}"))
    evals = [(r["step"], r["eval.loss"]) for r in read_metrics(out / "metrics.jsonl") if r["type"] == "eval"]
    best_step, best_loss, since, stop = None, None, 0, None
    for step, loss in evals:  # the rule, replayed from the log
        if best_loss is None or loss < best_loss:
            best_step, best_loss, since = step, loss, 0
        else:
            since += 1
            if since == 2:
                stop = step
                break
    assert stop is not None and summary["train"]["steps"] == stop < 40  # it stopped early, at the right eval
    assert evals[-1][0] == stop  # no evaluation after the stop
    best = json.loads((out / "best" / "best.json").read_text())
    assert best["step"] == best_step and best["value"] == best_loss and summary["best"]["step"] == best_step
    a, b = load_file(str(out / "best" / "model.safetensors")), load_file(str(out / "model" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # save_model=best
    assert summary["eval"]["loss"] == best_loss


def test_early_stopping_count_survives_a_resume(tmp_path, tiny_bert):
    """The best-model record travels in the loop state: resumed one step before the early stop (one evaluation
    without improvement already counted), the run stops at the same step with the same best."""
    from leantrain import train

    args = ("train.epochs=10", "train.lr=1e-2", "train.eval_every_steps=1", "train.log_every_steps=4",
            "checkpoint.best_metric=eval.loss", "train.early_stopping_patience=2", "checkpoint.every_steps=1",
            "checkpoint.keep=2", "checkpoint.keep_final=2")  # the step before the stop is kept
    whole = train(None, _tiny_args(tmp_path, tiny_bert, *args, f"output_dir={tmp_path / 'whole'}"))
    stop = whole["train"]["steps"]
    assert stop < 40 and whole["best"]["step"] < stop - 1  # stopped early, the last improvement two evals before
    at = tmp_path / "whole" / "checkpoints" / f"step-{stop - 1:07d}"
    resumed = train(None, _tiny_args(tmp_path, tiny_bert, *args, f"checkpoint.resume={at}",
                                     f"output_dir={tmp_path / 'resumed'}"))
    assert resumed["train"]["resumed_from_step"] == stop - 1
    assert resumed["train"]["steps"] == stop and resumed["best"] == whole["best"]
