"""The end of a run (engine/artifacts.py, issue 27 items 5 and 16, issue 35 probe 12): summary.json, which marks a
run complete, is written after every other file; a full disk during the final save exits 2 naming the disk and what
was kept; a kill during the final save leaves no half-written model/ (it is written whole, then moved in place)."""

from __future__ import annotations

import os
import subprocess
import sys
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


def test_disk_full_on_the_final_model_save_exits_2_and_keeps_the_last_checkpoint(corpus, tmp_path, monkeypatch,
                                                                                 capsys):
    """Item 5: the final save_pretrained on a full disk (ENOSPC from the write, as safetensors raises it): exit 2
    naming the disk and the kept checkpoint; the half-written model/ goes; the rerun resumes and finishes."""
    import errno

    import transformers.modeling_utils as mu

    real = mu.safe_save_file

    def full_disk(tensors, filename, *a, **k):  # noqa: ANN001
        Path(filename).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", filename)

    out = tmp_path / "run"
    monkeypatch.setattr(mu, "safe_save_file", full_disk)
    assert main(lm_args(corpus, out, "report.plots=false")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"disk full while saving the trained model to {out / 'model'}; free some space on the disk mounted at" in err
    assert f"Kept: the newest checkpoint ({out / 'checkpoints' / 'step-0000002'}) and metrics.jsonl" in err
    assert not (out / "model").exists() and not (out / "summary.json").exists()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000002"]
    monkeypatch.setattr(mu, "safe_save_file", real)
    assert main(lm_args(corpus, out, "report.plots=false")) == 0
    assert "resum" in capsys.readouterr().err and (out / "model" / "model.safetensors").is_file()


def test_disk_full_while_preparing_exits_2_and_removes_the_partial_shards(corpus, tmp_path, monkeypatch, capsys):
    """Item 5: `leantrain prepare` on a full disk (ENOSPC from the write of the shard file)."""
    import builtins
    import errno

    real_open = builtins.open

    class FullFile:
        def __init__(self, f):  # noqa: ANN001
            self.f = f

        def write(self, data):  # noqa: ANN001
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):  # noqa: ANN001
            return getattr(self.f, name)

    def open_full(file, mode="r", *a, **k):  # noqa: ANN001
        f = real_open(file, mode, *a, **k)
        return FullFile(f) if str(file).endswith("tokens-00000.bin") and "w" in mode else f

    from leantrain.data.lm import shard_writer

    monkeypatch.setattr(shard_writer, "open", open_full, raising=False)
    out = tmp_path / "shards"
    assert main(["prepare", str(corpus / "train.txt"), f"model.tokenizer={corpus / 'tok'}", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"disk full while writing the token shards to {out}; the partial shards were removed; free some space on " \
           "the disk mounted at" in err
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_a_kill_during_the_final_save_leaves_no_half_written_model_folder(corpus, tmp_path):
    """Probe 12: SIGKILL-like death after the weights are written and before the run settings: no model/ at all (a
    reader never sees weights without leantrain.json), no summary.json; the rerun resumes and writes the whole folder,
    and nothing of the staging is left."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "LEANTRAIN_TEST_CRASH_IN_FINAL_SAVE": "1"}
    args = [sys.executable, "-m", "leantrain", *lm_args(corpus, out, "report.plots=false")]
    killed = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert not (out / "model").exists() and not (out / "summary.json").exists()
    assert main(lm_args(corpus, out, "report.plots=false")) == 0  # the rerun, in this process: it resumes
    saved = {p.name for p in (out / "model").iterdir()}
    assert {"model.safetensors", "leantrain.json", "README.md", "config.json"} <= saved
    assert f'model="{(out / "model").as_posix()}"' in (out / "model" / "README.md").read_text()
    assert not [p.name for p in out.iterdir() if p.name.startswith((".staging-", ".old-"))]
