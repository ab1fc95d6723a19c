"""The end of a run (engine/artifacts.py, issue 27 items 5 and 16): summary.json, which marks a run complete, is
written after every other file; a full disk during the final save exits 2 naming the disk and what was kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from leantrain.cli import main
from tests.helpers import TINY_LLAMA, lm_documents, make_tiny_lm_tokenizer

pytestmark = pytest.mark.usefixtures("own_datasets_cache")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("final-save")
    make_tiny_lm_tokenizer(root / "tok")
    (root / "train.txt").write_text("\n\n".join(lm_documents(24, 0)))
    return root


def lm_args(corpus: Path, out: Path, *extra: str) -> list[str]:
    return ["train", *TINY_LLAMA, f"model.tokenizer={corpus / 'tok'}", "model.task=causal-lm",
            f"data.train={corpus / 'train.txt'}", "data.block_size=16", "train.batch_size=4", "train.max_steps=4",
            "checkpoint.every_steps=2", "report.progress=none", f"output_dir={out}", *extra]


def test_summary_json_is_written_after_the_model_card_and_the_plot(corpus, tmp_path, monkeypatch):
    """Item 16: a run killed the moment summary.json appears has its model card and loss curve already."""
    from leantrain.engine import artifacts

    out = tmp_path / "run"
    seen = {}
    real = artifacts.write_json

    def watch(path, obj):  # noqa: ANN001
        if Path(path).name == "summary.json" and not seen:
            seen.update({name: (out / name).is_file() for name in ("model/README.md", "loss_curve.png",
                                                                    "model/model.safetensors", "config.yaml")})
        return real(path, obj)

    monkeypatch.setattr(artifacts, "write_json", watch)
    assert main(lm_args(corpus, out, "report.plots=true")) == 0
    assert seen == {"model/README.md": True, "loss_curve.png": True, "model/model.safetensors": True,
                    "config.yaml": True}
