"""``leantrain prepare``: text -> token shards ahead of time; the folder it prints is a ``data.train`` for causal LMs."""

from __future__ import annotations

import json
import os

import pytest

from leantrain.cli import main
from leantrain.config import resolve
from leantrain.data.lm import corpus
from leantrain.data.lm.token_shards import MANIFEST, TokenShards
from leantrain.errors import DataError
from tests.helpers import lm_documents, make_tiny_lm_tokenizer


pytestmark = pytest.mark.usefixtures("own_datasets_cache")


@pytest.fixture(scope="module")
def tok_folder(tmp_path_factory):
    return make_tiny_lm_tokenizer(tmp_path_factory.mktemp("tok"))


def test_prepare_prints_the_corpus_and_train_reads_the_folder(tmp_path, tok_folder, capsys, monkeypatch):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "lc"))
    docs = lm_documents(30, seed=4)
    (tmp_path / "a.txt").write_text("\n\n".join(docs[:20]))
    (tmp_path / "b.txt").write_text("\n\n".join(docs[20:]))
    out = tmp_path / "shards"
    code = main(["prepare", str(tmp_path / "*.txt"), f"model.tokenizer={tok_folder}", r"data.document_separator=\n\n",
                 "data.block_size=16", f"output_dir={out}"])
    assert code == 0
    text = capsys.readouterr().out
    n_tokens = sum(len(d.split()) + 1 for d in docs)
    lengths = sorted(len(d.split()) + 1 for d in docs)
    assert f"tokens:     {n_tokens:,} (uint16" in text and "documents:  30\n" in text
    assert f"min {lengths[0]}" in text and f"max {lengths[-1]}" in text
    assert f"blocks:     {n_tokens // 16} of data.block_size=16" in text and f"path:       {out}" in text
    assert (out / MANIFEST).is_file() and TokenShards.open(out).n_documents == 30
    (out / MANIFEST).rename(tmp_path / "kept.json")  # as a prepare killed before it wrote the manifest leaves it
    with pytest.raises(DataError, match="no manifest.json: a preparation that did not finish"):
        corpus.load_and_validate(resolve(None, [f"data.train={out}"]).data, seed=1, batch_size=4)
    (tmp_path / "kept.json").rename(out / MANIFEST)

    cfg = resolve(None, [f"data.train={out}", "data.block_size=16", "data.eval_fraction=0.2"])
    prepared = corpus.load_and_validate(cfg.data, seed=1, batch_size=4)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tok_folder)
    train = corpus.process(prepared.train, tok, cfg.data)
    evaluation = corpus.process(prepared.eval, tok, cfg.data)
    assert len(train) + len(evaluation) == n_tokens // 16 and len(evaluation) == round(0.2 * (n_tokens // 16))
    assert train.shards.folder == out  # the prepared folder itself, no copy in the cache


def test_prepare_json_into_the_cache_then_train_reuses_it(tmp_path, tok_folder, capsys, monkeypatch):
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "lc"))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"n": i, "body": d}) + "\n" for i, d in enumerate(lm_documents(12))))
    args = ["prepare", str(rows), "data.text_column=body", f"model.tokenizer={tok_folder}",
            f"data.cache_dir={tmp_path / 'dc'}", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["documents"] == 12 and first["path"].startswith(str(tmp_path / "dc"))
    assert set(first["tokens_per_document"]) == {"min", "median", "p90", "max", "mean"}
    assert main(["cache", "--list"]) == 0
    assert first["path"] in capsys.readouterr().out  # leantrain cache --list shows the shards
    stamp = (tmp_path / first["path"] / MANIFEST).stat().st_mtime_ns
    cfg = resolve(None, [f"data.train={rows}", "data.text_column=body", f"data.cache_dir={tmp_path / 'dc'}",
                         "data.block_size=8"])
    from transformers import AutoTokenizer

    from leantrain.data.caches import using_cache_dir

    with using_cache_dir(cfg.data.cache_dir):  # as train does (engine/setup/training_data.py)
        prepared = corpus.load_and_validate(cfg.data, seed=1, batch_size=4)
    train = corpus.process(prepared.train, AutoTokenizer.from_pretrained(tok_folder), cfg.data)  # data.cache_dir
    assert str(train.shards.folder) == first["path"]  # the training run found the preparation
    assert (train.shards.folder / MANIFEST).stat().st_mtime_ns == stamp


@pytest.mark.parametrize("args, message", [
    (["prepare", "missing.txt", "model.tokenizer=x"], "file not found"),
    (["prepare", "model.tokenizer=x"], "needs the text to prepare"),
    (["prepare", "{corpus}"], "needs the tokenizer"),
    (["prepare", "{corpus}", "model.tokenizer={corpus}"], "could not load a tokenizer"),
    (["prepare", "{corpus}", "model.tokenizer={tok}", "output_dir={other}"], "holds other files"),
])
def test_prepare_refuses_with_a_message(tmp_path, tok_folder, capsys, args, message):
    (tmp_path / "c.txt").write_text("ba be bi")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.md").write_text("mine")
    fill = {"corpus": tmp_path / "c.txt", "tok": tok_folder, "other": tmp_path / "other"}
    assert main([a.format(**fill) for a in args]) == 2
    assert message in capsys.readouterr().err
    assert (tmp_path / "other" / "notes.md").read_text() == "mine"


def test_two_prepares_into_one_folder_do_not_interleave(tmp_path, tok_folder, capsys):
    """Issue 27 item 14: output_dir is locked as train locks its folder; a second prepare there exits 2 naming the
    process at work, and runs once it is gone."""
    import subprocess
    import sys

    (tmp_path / "c.txt").write_text("\n\n".join(lm_documents(10)))
    out = tmp_path / "shards"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from leantrain.engine.checkpoint.lock import acquire; "
                               f"acquire({str(out)!r}); print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        args = ["prepare", str(tmp_path / "c.txt"), f"model.tokenizer={tok_folder}", f"output_dir={out}"]
        assert main(args) == 2
        assert f"in use by another leantrain run (pid {holder.pid}" in capsys.readouterr().err
        assert not (out / MANIFEST).exists() and not list(out.glob("tokens-*"))
    finally:
        holder.communicate("", timeout=60)
    assert main(args) == 0 and TokenShards.open(out).n_documents == 1


# A `leantrain prepare` whose two tokenising workers each report their pid into a FIFO (the event) and then wait
# for good: the command is then stopped as a user or a scheduler would.
POOL_DRIVER = """
import os, signal, sys, threading
import leantrain.data.lm.shard_writer as sw

# a terminal's process: Ctrl-C raises KeyboardInterrupt, whatever the test's own process left ignored or blocked
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.default_int_handler)

def report_and_wait(texts):
    with open(os.environ["EVENT_FIFO"], "w") as f:
        f.write(f"{os.getpid()}\\n")
    threading.Event().wait()

if __name__ == "__main__":
    sw.BATCH_DOCS = 2
    sw._encode_in_worker = report_and_wait
    from leantrain.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def _gone(pid: int, timeout: float) -> bool:
    """Wait for a process that is not our child to exit (a pidfd becomes readable when it does)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGINT"])
def test_stopping_prepare_stops_its_workers(tmp_path, tok_folder, sig):
    """Issue 27 item 3: data.num_proc=2, the command SIGKILLed or Ctrl-C'd (SIGINT to the terminal's process
    group): no worker outlives it; Ctrl-C is one line, no traceback from a worker. (SIGTERM kills the command as
    SIGKILL does, with no handler of its own: the workers' death signal fires the same way.)"""
    import signal
    import subprocess
    import sys
    import threading

    (tmp_path / "c.txt").write_text("\n\n".join(lm_documents(12)))
    (tmp_path / "driver.py").write_text(POOL_DRIVER)
    fifo = tmp_path / "event"
    os.mkfifo(fifo)
    env = {**os.environ, "EVENT_FIFO": str(fifo), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), "prepare", str(tmp_path / "c.txt"),
                             f"model.tokenizer={tok_folder}", r"data.document_separator=\n\n", "data.num_proc=2",
                             f"output_dir={tmp_path / 'out'}"], env=env, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    pids: list[int] = []

    def collect() -> None:
        while len(pids) < 2:
            with open(fifo) as f:
                pids.extend(int(x) for x in f.read().split())

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    reader.join(timeout=240)
    try:
        assert len(pids) >= 2, "the workers did not start"
        if sig == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        else:
            os.kill(proc.pid, getattr(signal, sig))
        err = proc.communicate(timeout=120)[1]
        assert all(_gone(pid, 60) for pid in pids), f"a worker outlived the command ({sig})"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if sig == "SIGINT":
        assert proc.returncode == 130 and "leantrain: interrupted" in err
        assert "Traceback" not in err and "Error" not in err, err
    assert not (tmp_path / "out" / MANIFEST).exists()
