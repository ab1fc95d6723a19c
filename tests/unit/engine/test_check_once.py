"""Every check runs once per process: ``leantrain train`` describes the run once (``engine.run_description``) and
the loop, the data preparation and the workers trust the description."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter

import pytest

from tests.helpers import write_rows, word_rows
from leantrain.cli import main
from leantrain.config import resolve
from leantrain.data import modalities
from leantrain.engine.evaluation import samples
from leantrain.engine.setup import preflight, run_description, training_data
from leantrain.engine.setup.run_file import RUN_FILE
from leantrain.errors import UserError
from leantrain.methods import detect
from leantrain.modeling import qlora

CHECKS = (preflight.check_train, preflight.check_max_length, preflight.check_model_plan, preflight.check_attention,
          qlora.check_qlora, qlora.check_qlora_precision, samples.check_sample_prompts, samples.check_sample_room,
          detect.resolve_task_reason, training_data.run_task_reason,
          training_data.check_task_keys, training_data.check_loaded_data, training_data.check_config,
          training_data.check_stop_when, training_data.prepare_training_data)


def count_calls(monkeypatch, functions) -> Counter:
    """Each function wrapped, wherever a leantrain module holds it by name, by one that counts its calls and runs it."""
    counts: Counter = Counter()
    for func in functions:
        def counted(*args, _func=func, **kwargs):
            counts[_func.__name__] += 1
            return _func(*args, **kwargs)

        for module in [m for name, m in sys.modules.items() if name.startswith("leantrain")]:
            if getattr(module, func.__name__, None) is func:
                monkeypatch.setattr(module, func.__name__, counted)
    text = modalities.MODALITIES["text"]  # the data side holds its loader itself

    def load_and_validate(*args, **kwargs):
        counts["load_and_validate"] += 1
        return text.load_and_validate(*args, **kwargs)

    monkeypatch.setitem(modalities.MODALITIES, "text", dataclasses.replace(text, load_and_validate=load_and_validate))
    return counts


def test_a_single_process_run_checks_everything_once(tiny_bert, tmp_path, monkeypatch):
    import leantrain.commands.train  # noqa: F401 - loaded before counting: its names are wrapped too

    train_f = write_rows(tmp_path / "train.csv", word_rows(16))
    dev_f = write_rows(tmp_path / "dev.csv", word_rows(8, seed=1))
    counts = count_calls(monkeypatch, CHECKS)
    assert main(["train", f"model.name={tiny_bert}", f"data.train={train_f}", f"data.eval={dev_f}", "train.max_steps=2",
                 "train.batch_size=8", "efficiency.precision=fp32", "report.plots=false", "report.progress=none",
                 f"output_dir={tmp_path / 'run'}"]) == 0
    assert counts == Counter({**{f.__name__: 1 for f in CHECKS}, "load_and_validate": 1})


def test_a_launched_worker_trusts_its_parents_description(tmp_path, monkeypatch):
    facts = tmp_path / "run.json"
    facts.write_text(json.dumps({"task": "text-classification", "task_reason": "the parent's"}))
    monkeypatch.setenv(RUN_FILE, str(facts))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    counts = count_calls(monkeypatch, CHECKS)
    cfg = resolve(None, [f"data.train={tmp_path / 'not-read.csv'}", f"output_dir={tmp_path / 'run'}"])
    run = run_description.describe_run(cfg)
    assert (run.task.name, run.task_reason, run.data, run.cfg) == ("text-classification", "the parent's", None, cfg)
    assert counts == Counter()  # nothing checked again, no data read here (the worker loads it to train)


def test_a_worker_whose_description_is_missing_stops_with_exit_2(tmp_path, monkeypatch):
    monkeypatch.setenv(RUN_FILE, str(tmp_path / "gone" / "run.json"))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match=f"{RUN_FILE}=.*run.json: the run description .* is missing") as e:
        run_description.describe_run(resolve(None, []))
    assert e.value.exit_code == 2
