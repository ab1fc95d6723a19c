"""Loss-curve plot and model card."""

from __future__ import annotations

import yaml

from leantrain.report.card import human_bytes, looks_like_hub_id, write_model_card
from leantrain.report.plots import plot_loss_curve, step_metric_keys


def _records(steps: int = 60) -> list[dict]:
    rows: list[dict] = []
    for s in range(5, steps + 1, 5):
        lr = 5e-5 * min(1.0, s / 10) * (1 - s / (steps + 5))
        rows.append({"type": "train", "step": s, "epoch": s / 30, "loss": 1.1 * 0.97**s + 0.05, "lr": lr,
                     "samples_per_second": 120.0})
        if s % 20 == 0:
            rows.append({"type": "eval", "step": s, "eval.loss": 0.9 * 0.98**s + 0.1,
                         "eval.accuracy": min(0.95, 0.4 + s / 100), "eval.f1_macro": 0.5})
    rows.append({"type": "train", "step": steps + 5, "loss": "nan", "lr": 1e-6})  # non-finite, as logs.py writes it
    return rows


def test_plot_writes_png(tmp_path):
    out = plot_loss_curve(_records(), tmp_path / "sub" / "loss_curve.png", title="MiniLM — demo")
    assert out == tmp_path / "sub" / "loss_curve.png"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plot_train_only_and_nothing(tmp_path):
    only_train = [r for r in _records() if r["type"] == "train"]
    assert plot_loss_curve(only_train, tmp_path / "a.png") is not None
    assert plot_loss_curve([], tmp_path / "b.png") is None
    assert plot_loss_curve([{"type": "train", "step": 1, "lr": 1e-5}], tmp_path / "c.png") is None
    assert not (tmp_path / "b.png").exists()


def test_plot_has_a_panel_per_step_metric(tmp_path):
    """A method's step metrics in the train records (e.g. a reward) get a panel each; the standard keys do not."""
    from PIL import Image

    plain = _records()
    with_metrics = [dict(r, reward=0.1 * i, kl=0.01) if r["type"] == "train" else r for i, r in enumerate(plain)]
    with_metrics[0]["grad_norm"], with_metrics[0]["mfu"] = 1.0, 0.1
    assert step_metric_keys(plain) == [] and step_metric_keys(with_metrics) == ["reward", "kl"]
    heights = [Image.open(plot_loss_curve(records, tmp_path / f"{i}.png")).height
               for i, records in enumerate((plain, with_metrics))]
    assert heights[1] > heights[0]


def test_plot_stacks_the_time_share_of_each_phase_in_a_panel_of_its_own(tmp_path):
    from PIL import Image

    from leantrain.report.plots import time_shares

    plain = _records()
    split = [dict(r, time_split={"generation": 3.0, "compute": 1.0}, time_share={"generation": 0.75, "compute": 0.25})
             if r["type"] == "train" and r["step"] % 10 == 0 else r for r in plain]
    split[0] = dict(split[0], time_share={"data": 1.0})  # a phase seen in one window only: 0 in the others
    steps, shares = time_shares(split)
    assert steps[:2] == [5.0, 10.0] and list(shares) == ["data", "generation", "compute"]
    assert shares["data"][:2] == [1.0, 0.0] and shares["generation"][:2] == [0.0, 0.75]
    assert step_metric_keys(split) == []  # not a step metric of the method
    heights = [Image.open(plot_loss_curve(records, tmp_path / f"{i}.png")).height
               for i, records in enumerate((plain, split))]
    assert heights[1] > heights[0]


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_model_card_full(tmp_path):
    summary = {
        "eval": {"accuracy": 0.8733, "f1_macro": 0.8712, "mcc": 0.81, "loss": 0.3521, "samples": 300},
        "train": {"steps": 141, "epochs": 3.0, "samples_per_second": 95.3, "tokens_per_second": 2410.0,
                  "peak_memory_bytes": 3 * 2**30 + 2**29, "cuda_max_allocated_bytes": 700 * 2**20,
                  "wall_seconds": 62.4},
        "device": {"type": "cpu", "name": "x86_64"},
        "distributed": {"world_size": 1},
        "versions": {"leantrain": "0.1.0", "torch": "2.13.0", "transformers": "5.3.0"},
    }
    config = {"train": {"epochs": 3.0, "batch_size": 32, "lr": 5e-5, "seed": 42, "micro_batch_size": None},
              "optim": {"name": "adamw", "weight_decay": 0.01, "betas": [0.9, 0.999]}}
    path = write_model_card(tmp_path / "model", base_model="sentence-transformers/all-MiniLM-L6-v2",
                            label_names=["negative", "neutral", "positive"], summary=summary, config=config)
    text = path.read_text()
    assert path == tmp_path / "model" / "README.md"
    meta = _front_matter(text)
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "text-classification"
    assert meta["base_model"] == "sentence-transformers/all-MiniLM-L6-v2" and "leantrain" in meta["tags"]
    for needle in ["| 0 | negative |", "| 2 | positive |", "| accuracy | 0.8733 |", "| macro F1 | 0.8712 |",
                   "MCC", "300", "| train.lr | 5e-05 |", "| optim.weight_decay | 0.01 |", "0.9, 0.999",
                   "3.50 GiB", "700.00 MiB", "2,410", "95.3", "62.4 s", "| optimizer steps | 141 |",
                   "torch 2.13.0", 'pipeline("text-classification"', "cpu x86_64"]:
        assert needle in text, needle


def test_model_card_tolerates_missing_and_local_base(tmp_path):
    local = tmp_path / "my-local-bert"
    local.mkdir()
    path = write_model_card(tmp_path / "m", base_model=str(local), label_names=["a|b", "c"], summary={}, config={})
    text = path.read_text()
    assert "base_model" not in _front_matter(text)
    assert "my-local-bert" in text and "a\\|b" in text and "## Evaluation" not in text
    assert 'pipeline("text-classification"' in text


def test_helpers():
    assert looks_like_hub_id("bert-base-uncased") and looks_like_hub_id("org/model.v2")
    assert not looks_like_hub_id("/abs/path") and not looks_like_hub_id("./rel") and not looks_like_hub_id("a/b/c")
    assert not looks_like_hub_id("../x") and not looks_like_hub_id("")
    assert human_bytes(512 * 2**20) == "512.00 MiB" and human_bytes(2**31) == "2.00 GiB" and human_bytes(None) is None
