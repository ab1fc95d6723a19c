"""Caches outside the run folder (data.cache_dir, `leantrain cache --list/--clear`) and the checkpoints a finished
run keeps (checkpoint.keep_final)."""

import json

import pytest

from tests.helpers import write_rows
from leantrain import train
from leantrain.cli import main


@pytest.fixture
def leantrain_cache(tmp_path, monkeypatch):
    path = tmp_path / "lt-cache"
    monkeypatch.setenv("LEANTRAIN_CACHE", str(path))
    return path


def _rows(n):
    return [{"text": ("good fine " if i % 2 else "bad poor ") * (1 + i % 3), "label": i % 2} for i in range(n)]


def test_data_cache_dir_holds_the_datasets_cache_and_cache_command_lists_and_clears_it(tmp_path, leantrain_cache,
                                                                                         capsys):
    from leantrain.config import resolve
    from leantrain.engine.setup.training_data import validate_data

    data = write_rows(tmp_path / "train.csv", _rows(30))
    ds_cache = tmp_path / "ds-cache"
    validate_data(resolve(None, [f"data.train={data}", f"data.cache_dir={ds_cache}"]))
    arrows = list(ds_cache.rglob("*.arrow"))
    assert arrows, sorted(str(p) for p in ds_cache.rglob("*"))
    (leantrain_cache / "peak_flops.json").write_text("{}")

    assert main(["cache", "--list"]) == 0
    out = capsys.readouterr().out
    folder = str(arrows[0].parent)
    assert folder in out and str(data) in out and "peak_flops.json" in out and "total" in out
    assert str(leantrain_cache) in out

    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert f"{folder}" in out and "removed" in out and "peak_flops.json" in out
    assert not list(ds_cache.rglob("*.arrow")) and not leantrain_cache.exists()
    assert main(["cache", "--clear"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_offline_hub_name_error_names_the_cache_not_none(monkeypatch, tmp_path):
    import datasets

    from leantrain.data.caches import using_cache_dir
    from leantrain.data.sources import SourceError, open_source

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with using_cache_dir(tmp_path / "c"), pytest.raises(SourceError) as e:
        open_source("no-such-org/no-such-dataset", "data.train")
    text = str(e.value)
    assert "None" not in text and "offline" in text and str(tmp_path / "c") in text and "data.train" in text


def test_finished_run_keeps_only_the_last_checkpoint_and_still_counts_as_complete(tmp_path, tiny_bert, capsys):
    data = write_rows(tmp_path / "train.csv", _rows(64))
    out = tmp_path / "run"
    args = [f"model.name={tiny_bert}", f"data.train={data}", "train.max_steps=4", "train.batch_size=8",
            "checkpoint.every_steps=1", "checkpoint.keep=3", "report.plots=false", f"output_dir={out}"]
    summary = train(None, args)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000003"]
    assert summary["checkpoints"]["removed"] == ["step-0000002", "step-0000001"]
    assert summary["checkpoints"]["kept"] == ["step-0000003"] and summary["checkpoints"]["removed_bytes"] > 0
    assert json.loads((out / "summary.json").read_text())["checkpoints"] == summary["checkpoints"]
    assert "removed 2 checkpoint(s) (step-0000002, step-0000001" in capsys.readouterr().err
    again = train(None, [*args, "checkpoint.keep_final=0"])  # a completed run is detected by summary.json
    assert "already complete" in capsys.readouterr().err and again["train"]["steps"] == 4


def test_cache_list_names_a_relative_source_by_its_absolute_path(tmp_path, leantrain_cache, monkeypatch, capsys):
    from leantrain.data.caches import record_cache_folder

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("x\n")
    monkeypatch.chdir(tmp_path)
    record_cache_folder(str(tmp_path / "shards"), "corpus/a.txt, corpus/*.txt, HuggingFaceFW/fineweb")
    monkeypatch.chdir(tmp_path.parent)
    (tmp_path / "shards").mkdir()
    assert main(["cache", "--list"]) == 0
    out = capsys.readouterr().out
    assert f"{tmp_path}/corpus/a.txt, {tmp_path}/corpus/*.txt, HuggingFaceFW/fineweb" in out


def test_precomputed_values_inside_a_datasets_folder_are_an_entry_of_their_own(tmp_path, leantrain_cache, capsys):
    """The reference log-probs sit beside the processed data (inside its datasets folder): listed once, on their own
    line (the datasets folder's size leaves them out), and cleared."""
    from leantrain.data.caches import PRECOMPUTED, entries, record_cache_folder

    data = tmp_path / "ds" / "json" / "abc"
    (data / PRECOMPUTED).mkdir(parents=True)
    (data / "cache-1.arrow").write_bytes(b"x" * 1000)
    (data / PRECOMPUTED / "key.npy").write_bytes(b"y" * 300)
    record_cache_folder(str(data), str(tmp_path / "prefs.jsonl"))
    rows = {r["kind"]: r for r in entries() if r["kind"] != "leantrain"}
    assert rows["datasets"]["path"] == str(data) and rows["datasets"]["bytes"] == 1000
    assert rows["precomputed"]["path"] == str(data / PRECOMPUTED) and rows["precomputed"]["bytes"] == 300
    assert main(["cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert f"removed      300 B  {data / PRECOMPUTED}" in out and f"removed     1000 B  {data}\n" in out
    assert not (tmp_path / "ds" / "json").exists()
