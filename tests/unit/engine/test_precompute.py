"""Precomputed per-row columns (the preference task's reference log-probs under preference.reference=precompute):
equal to the reference forward, in the rows' order, cached on disk under a key of the model and the data, read
again by the next run, never read half-written or from another model."""

from __future__ import annotations

import copy

import datasets
import numpy as np
import pytest
import torch

from leantrain.config import resolve
from leantrain.engine.setup import precompute
from leantrain.methods import get_task

IGNORE = -100


@pytest.fixture(scope="module")
def setup():
    from accelerate import Accelerator
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, use_cache=False)).eval()
    g = np.random.default_rng(0)
    rows = []
    for _ in range(7):
        prompt = g.integers(2, 40, g.integers(1, 4)).tolist()
        c, r = g.integers(2, 40, g.integers(1, 6)).tolist(), g.integers(2, 40, g.integers(1, 6)).tolist()
        rows.append({"chosen_input_ids": prompt + c, "chosen_labels": [IGNORE] * len(prompt) + c,
                     "rejected_input_ids": prompt + r, "rejected_labels": [IGNORE] * len(prompt) + r,
                     "length": len(prompt) + max(len(c), len(r))})
    task = get_task("preference").configured(resolve(None, ["preference.reference=precompute"]))
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()  # an earlier test's mixed precision must not leak into this process-wide state
    return Accelerator(cpu=True, mixed_precision="no"), model, task, datasets.Dataset.from_list(rows)


def collate(rows: list[dict]) -> dict:
    seqs = [(r["chosen_input_ids"], r["chosen_labels"]) for r in rows] + \
           [(r["rejected_input_ids"], r["rejected_labels"]) for r in rows]
    t = max(len(s[0]) for s in seqs)
    return {"input_ids": torch.tensor([s[0] + [0] * (t - len(s[0])) for s in seqs]),
            "attention_mask": torch.tensor([[1] * len(s[0]) + [0] * (t - len(s[0])) for s in seqs]),
            "labels": torch.tensor([s[1] + [IGNORE] * (t - len(s[1])) for s in seqs])}


def test_reference_logps_are_computed_once_cached_and_read_back(setup, tmp_path, monkeypatch, caplog):
    accelerator, model, task, ds = setup
    monkeypatch.setattr(precompute, "default_datasets_cache", lambda: tmp_path)
    with caplog.at_level("INFO", logger="leantrain"):
        out = precompute.with_precomputed(task, model, ds, collate, accelerator, 3, "train data")
    assert "computed for 7 rows" in caplog.text
    with torch.no_grad():  # row by row, in the dataset's order
        expected = torch.cat([task.reference_logps(model, collate([ds[i]])) for i in range(len(ds))])
    got = torch.tensor([out["ref_chosen_logps"], out["ref_rejected_logps"]]).T
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    [cached] = list((tmp_path / precompute.FOLDER).glob("*.npy"))
    caplog.clear()
    with caplog.at_level("INFO", logger="leantrain"):
        again = precompute.with_precomputed(task, model, ds, collate, accelerator, 3, "train data")
    assert "read from" in caplog.text and again["ref_chosen_logps"] == out["ref_chosen_logps"]
    cached.write_bytes(cached.read_bytes()[:40])  # half-written: not used, computed again
    caplog.clear()
    with caplog.at_level("INFO", logger="leantrain"):
        precompute.with_precomputed(task, model, ds, collate, accelerator, 3, "train data")
    assert "computed for 7 rows" in caplog.text
    other = copy.deepcopy(model)  # another model: another key
    with torch.no_grad():
        next(other.parameters()).add_(0.01)
    assert precompute.model_fingerprint(other) != precompute.model_fingerprint(model)
    precompute.with_precomputed(task, other, ds, collate, accelerator, 3, "train data")
    assert len(list((tmp_path / precompute.FOLDER).glob("*.npy"))) == 2
    assert not list((tmp_path / precompute.FOLDER).glob("*.tmp*"))


def test_values_another_output_loss_computed_are_not_read(setup, tmp_path, monkeypatch):
    """The chunked loss gives the same reference log-probs to rounding, not to the bit: a run with it computes its own
    rather than read those of a run without it (else a run's result depends on which ran first)."""
    from leantrain.modeling.chunked_loss import install_chunked_loss

    accelerator, model, task, ds = setup
    monkeypatch.setattr(precompute, "default_datasets_cache", lambda: tmp_path)
    plain = precompute.with_precomputed(task, model, ds, collate, accelerator, 3, "train data")
    chunked = copy.deepcopy(model)
    assert install_chunked_loss(chunked, chunk_tokens=4)
    assert precompute.compute_paths(chunked) != precompute.compute_paths(model)
    again = precompute.with_precomputed(task, chunked, ds, collate, accelerator, 3, "train data")
    assert len(list((tmp_path / precompute.FOLDER).glob("*.npy"))) == 2
    np.testing.assert_allclose(again["ref_chosen_logps"], plain["ref_chosen_logps"], rtol=1e-5, atol=1e-5)


def test_no_columns_without_precompute(setup):
    accelerator, model, _, ds = setup
    task = get_task("preference").configured(resolve(None, ["preference.reference=live"]))
    assert precompute.with_precomputed(task, model, ds, collate, accelerator, 3, "train data") is ds


def test_cache_list_and_clear_know_the_precomputed_values(setup, tmp_path, monkeypatch, capsys):
    from leantrain.cli import main

    accelerator, model, task, ds = setup
    monkeypatch.setattr(precompute, "default_datasets_cache", lambda: tmp_path / "datasets")
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "lt-cache"))
    precompute.with_precomputed(task, model, ds, collate, accelerator, 3, "train data")
    folder = tmp_path / "datasets" / precompute.FOLDER
    [cached] = list(folder.glob("*.npy"))
    assert main(["cache", "--list"]) == 0
    out = capsys.readouterr().out
    assert f"precomputed {folder}  <- ref_chosen_logps, ref_rejected_logps of train data" in out
    assert main(["cache", "--clear"]) == 0
    assert str(folder) in capsys.readouterr().out and not folder.exists() and (tmp_path / "datasets").is_dir()


@pytest.mark.parametrize("edit", ["plus-50", "float16"])
def test_an_edited_cache_file_is_computed_again_saying_so(setup, tmp_path, monkeypatch, caplog, edit):
    """The sha256 and dtype of the bytes written are recorded beside them: a file edited afterwards (+50 on one
    column, or re-saved as float16: the same shape, finite) is not read as computed before (issue 35, probe 7)."""
    accelerator, model, task, ds = setup
    monkeypatch.setattr(precompute, "default_datasets_cache", lambda: tmp_path)
    out = precompute.with_precomputed(task, model, ds, collate, accelerator, 3, "train data")
    [cached] = list((tmp_path / precompute.FOLDER).glob("*.npy"))
    values = np.load(cached)
    if edit == "plus-50":
        values[:, 0] += 50
    np.save(cached, values.astype(np.float16) if edit == "float16" else values)
    with caplog.at_level("INFO", logger="leantrain"):
        again = precompute.with_precomputed(task, model, ds, collate, accelerator, 3, "train data")
    assert "not the file that was written" in caplog.text and "computed for 7 rows" in caplog.text
    assert again["ref_chosen_logps"] == out["ref_chosen_logps"]
    assert np.load(cached).dtype == np.float32


def test_live_adapter_and_precompute_give_the_same_reference_logps_under_bf16(setup):
    """The policy's forward runs under Accelerate's autocast (prepare wraps it); the live copy is not prepared, so it
    gets the same autocast from with_model; the adapter reference is the prepared model with its adapters off."""
    peft = pytest.importorskip("peft")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    _, model, _, ds = setup
    batch = collate([ds[i] for i in range(len(ds))])
    AcceleratorState._reset_state()
    try:
        accelerator = Accelerator(cpu=True, mixed_precision="bf16")
        task = get_task("preference").configured(resolve(None, ["preference.reference=precompute"]))
        values = precompute.compute_values(task, model, ds, collate, accelerator, 3)  # under the autocast
        want = torch.from_numpy(values)
        live = get_task("preference").configured(resolve(None, ["preference.reference=live"]))
        got_live = live.model.bind(model, accelerator.autocast).reference_logps(model, batch)  # no outer autocast
        fp32 = live.model.bind(model).reference_logps(model, batch)
        lora = peft.get_peft_model(copy.deepcopy(model), peft.LoraConfig(r=2, lora_alpha=4,
                                                                          target_modules=["q_proj", "v_proj"]))
        adapter = get_task("preference").configured(resolve(None, ["preference.reference=adapter",
                                                                                 "peft.method=lora"]))
        got_adapter = adapter.reference_logps(accelerator.prepare_model(lora), batch)
    finally:
        AcceleratorState._reset_state()
    torch.testing.assert_close(got_live, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_adapter, want, rtol=1e-5, atol=1e-5)
    assert (fp32 - want).abs().max() > 1e-4  # bf16 changes the values: the precision context is what matched them

