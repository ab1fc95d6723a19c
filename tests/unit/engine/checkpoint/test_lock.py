"""One run per output_dir (issue 17, item 2): a second run in a locked output_dir exits 2 naming the holder's pid;
a lock file left by a dead process never blocks."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import word_rows, write_rows
from leantrain.cli import main

HOLD = ("import sys; from pathlib import Path; from leantrain.engine.checkpoint.lock import acquire; "
        "acquire(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()")


def _holder(out):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _train_args(tiny_bert, tmp_path, out):
    write_rows(tmp_path / "train.csv", word_rows(16, 0, max_words=10))
    return ["train", f"model.name={tiny_bert}", f"data.train={tmp_path / 'train.csv'}", "train.batch_size=8",
            "train.max_steps=2", "report.plots=false", "report.progress=none", "checkpoint.every_steps=0",
            f"output_dir={out}"]


def test_second_run_in_locked_output_dir_exits_2_naming_pid_and_stale_lock_does_not_block(tiny_bert, tmp_path,
                                                                                           capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = _holder(out)
    try:
        assert main(_train_args(tiny_bert, tmp_path, out)) == 2
        err = capsys.readouterr().err
        assert f"in use by another leantrain run (pid {holder.pid}" in err and "another output_dir" in err
        assert not (out / "summary.json").exists()
    finally:
        holder.communicate("")  # the holder exits: its lock file stays behind, stale
    assert (out / ".lock").read_text().split()[0] == str(holder.pid)
    assert main(_train_args(tiny_bert, tmp_path, out)) == 0  # a dead process's lock never blocks
    assert (out / "summary.json").is_file()
    assert (out / ".lock").read_text().split()[0] == str(os.getpid())


def test_lock_is_released_after_the_run(tiny_bert, tmp_path):
    from leantrain.engine.checkpoint.lock import _held

    out = tmp_path / "run"
    assert main(_train_args(tiny_bert, tmp_path, out)) == 0
    assert not _held
    holder = _holder(out)  # another process can take it at once
    holder.communicate("")
