"""Token shards: tokenise once into flat files + manifest, cached by tokenizer and source (data/lm/token_sources.py,
shard_writer.py, token_shards.py, shard_cache.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from leantrain.data.caches import using_cache_dir
from leantrain.data.sources import SourceError
from leantrain.data.lm.shard_cache import cache_root, prepared_shards
from leantrain.data.lm.shard_writer import token_dtype, write_shards
from leantrain.data.lm.token_shards import MANIFEST, TokenShards
from leantrain.data.lm.token_sources import open_token_source
from tests.helpers import lm_documents, make_gpt2_tokenizer, make_tiny_lm_tokenizer, write_rows


pytestmark = pytest.mark.usefixtures("own_datasets_cache")


@pytest.fixture(autouse=True)
def own_leantrain_cache(tmp_path, monkeypatch):
    """The record of cache folders (leantrain cache --list) goes to a folder of this test's, not ~/.cache."""
    monkeypatch.setenv("LEANTRAIN_CACHE", str(tmp_path / "leantrain-cache"))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return AutoTokenizer.from_pretrained(make_tiny_lm_tokenizer(tmp_path_factory.mktemp("tok")))


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return AutoTokenizer.from_pretrained(make_gpt2_tokenizer(tmp_path_factory.mktemp("gpt2")))


def stream(shards: TokenShards) -> list[int]:
    return shards.read(0, shards.n_tokens).tolist()


def test_round_trip_txt_with_separator(tmp_path, tok):
    docs = lm_documents(40, seed=1)
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n\n\n\n")  # trailing blank documents are skipped
    source = open_token_source(str(path), "data.train", separator="\n\n")
    manifest = write_shards(source, tok, tmp_path / "out")
    shards = TokenShards.open(tmp_path / "out")
    assert tok.decode(stream(shards)) == " <eos> ".join(docs) + " <eos>"
    assert manifest["documents"] == shards.n_documents == 40
    assert manifest["dtype"] == "uint16" and manifest["tokens"] == sum(len(d.split()) + 1 for d in docs)
    starts = shards.document_starts()
    assert [tok.decode(shards.read(int(a), int(b) - 1).tolist()) for a, b in zip(starts, shards.doc_starts[1:])] == docs
    assert shards.verify() == []


def test_round_trip_gpt2_files_and_jsonl(tmp_path, gpt2):
    texts = ["Hello world.\nSecond line ", "  café ☕ naïve\n", "Last one"]
    for i, t in enumerate(texts):
        (tmp_path / f"doc{i}.txt").write_text(t)
    source = open_token_source(str(tmp_path / "doc*.txt"), "data.train")  # a glob: one document per file
    write_shards(source, gpt2, tmp_path / "a")
    shards = TokenShards.open(tmp_path / "a")
    assert gpt2.decode(stream(shards)) == "".join(t + "<|endoftext|>" for t in texts)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(texts)))
    source = open_token_source(str(rows), "data.train", text_column="body")
    write_shards(source, gpt2, tmp_path / "b")
    assert stream(TokenShards.open(tmp_path / "b")) == stream(shards)
    folder_source = open_token_source(str(tmp_path), "data.train")  # a folder of .txt files
    assert folder_source.kind == "txt" and len(folder_source.files) == 3


def test_text_column_problems_name_the_file(tmp_path):
    csv = write_rows(tmp_path / "d.csv", [{"title": "a", "body": "b c"}])
    with pytest.raises(SourceError, match="data.text_column"):
        open_token_source(str(csv), "data.train")
    with pytest.raises(SourceError, match="no column 'text'.*d.csv|d.csv.*no column 'text'"):
        open_token_source(str(csv), "data.train", text_column="text")
    assert open_token_source(str(csv), "data.train", text_column="body").text_column == "body"
    with pytest.raises(SourceError, match="matches no file"):
        open_token_source(str(tmp_path / "nothing*.txt"), "data.train")


def test_uint16_and_uint32(tmp_path):
    assert token_dtype(50257) == np.uint16 and token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    words = [f"w{i}" for i in range(70000)]
    tok = AutoTokenizer.from_pretrained(make_tiny_lm_tokenizer(tmp_path / "big", words=words))
    text = "w0 w69999 w65535 w65536 w12"
    (tmp_path / "c.txt").write_text(text)
    manifest = write_shards(open_token_source(str(tmp_path / "c.txt"), "data.train"), tok, tmp_path / "out")
    shards = TokenShards.open(tmp_path / "out")
    assert manifest["dtype"] == "uint32" and max(stream(shards)) == 70001
    assert tok.decode(stream(shards)) == text + " <eos>"


def test_cache_hit_and_miss_on_source_or_tokenizer_change(tmp_path, tok):
    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(20)))
    with using_cache_dir(tmp_path / "cache"):
        first = prepared_shards(open_token_source(str(path), "data.train", separator="\n"), tok)
        stamp = (first.folder / MANIFEST).stat().st_mtime_ns
        again = prepared_shards(open_token_source(str(path), "data.train", separator="\n"), tok)
        assert again.folder == first.folder and (first.folder / MANIFEST).stat().st_mtime_ns == stamp  # reused
        other_split = prepared_shards(open_token_source(str(path), "data.train", separator="\n\n"), tok)
        assert other_split.folder != first.folder and other_split.n_documents == 1
        path.write_text("\n".join(lm_documents(21)))  # the source changed
        changed = prepared_shards(open_token_source(str(path), "data.train", separator="\n"), tok)
        assert changed.folder != first.folder and changed.n_documents == 21
        other_tok = AutoTokenizer.from_pretrained(make_tiny_lm_tokenizer(tmp_path / "tok2", words=["ba", "be"]))
        retok = prepared_shards(open_token_source(str(path), "data.train", separator="\n"), other_tok)
        assert retok.folder not in (first.folder, changed.folder)
        assert sorted(p.name for p in cache_root().iterdir()) == sorted(
            p.folder.name for p in (first, other_split, changed, retok))  # no temporary folders left


def test_killed_preparation_is_redone_never_used(tmp_path, tok):
    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(20)))
    source = open_token_source(str(path), "data.train", separator="\n")
    with using_cache_dir(tmp_path / "cache"):
        good = prepared_shards(source, tok)
        expected = stream(good)
        folder = good.folder
        (folder / MANIFEST).unlink()  # as a preparation killed before its manifest was written leaves it
        with open(folder / "tokens-00000.bin", "r+b") as f:
            f.truncate(10)
        with pytest.raises(SourceError, match="no manifest.json"):
            TokenShards.open(folder)
        redone = prepared_shards(source, tok)
        assert redone.folder == folder and stream(redone) == expected and (folder / MANIFEST).is_file()
        # a killed run's temporary folder (its process gone) is cleared by the next preparation of the same key
        stale = folder.parent / f"{folder.name}.tmp-999999999-abcdef"
        stale.mkdir()
        (folder / MANIFEST).unlink()
        prepared_shards(source, tok)
        assert not stale.exists()


def test_a_damaged_cache_entry_is_replaced(tmp_path, tok, caplog):
    """Issue 27 item 4: a cached entry whose token file was truncated (its manifest intact) is prepared again and
    the new preparation takes its place; the next run reuses it."""
    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(20)))
    source = open_token_source(str(path), "data.train", separator="\n")
    with using_cache_dir(tmp_path / "cache"):
        good = prepared_shards(source, tok)
        expected = stream(good)
        with open(good.folder / "tokens-00000.bin", "r+b") as f:
            f.truncate(10)
        with caplog.at_level("WARNING", logger="leantrain"):
            redone = prepared_shards(source, tok)
        assert "tokens-00000.bin" in caplog.text and "preparing again" in caplog.text
        assert redone.folder == good.folder and stream(redone) == expected
        assert stream(prepared_shards(source, tok)) == expected
        assert sorted(p.name for p in cache_root().iterdir()) == [good.folder.name]  # nothing set aside is left


def _rehash(folder: Path, name: str) -> None:
    """Make the manifest's sha256 of ``name`` agree with its bytes again (a consistent but wrong folder)."""
    from leantrain.files import sha256_file

    manifest = json.loads((folder / MANIFEST).read_text())
    for entry in [*manifest["shards"], manifest["index"]]:
        if entry["file"] == name:
            entry["sha256"] = sha256_file(folder / name)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _edit_manifest(folder: Path, change) -> None:  # noqa: ANN001
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


DAMAGES = {
    "overwritten tokens": (lambda f: _poke(f / "tokens-00000.bin", 4, b"\x05\x00"),
                           "tokens-00000.bin does not match its sha256"),
    "ids past the vocabulary": (lambda f: (_poke(f / "tokens-00000.bin", 4, b"\xff\xff"), _rehash(f, "tokens-00000.bin")),
                                "tokens-00000.bin holds token id 65535, outside the vocabulary"),
    "a huge document offset": (lambda f: _poke(f / "documents.bin", 8, (10 ** 12).to_bytes(8, "little")),
                               "documents.bin does not match its sha256"),
    "offsets out of order": (lambda f: (_poke(f / "documents.bin", 8, (10 ** 6).to_bytes(8, "little")),
                                        _rehash(f, "documents.bin")), "document offsets do not increase"),
    "the last offset": (lambda f: (_poke(f / "documents.bin", 8 * 10, (10 ** 6).to_bytes(8, "little")),
                                   _rehash(f, "documents.bin")), "documents.bin runs from 0 to 1000000"),
    "no index key": (lambda f: _edit_manifest(f, lambda m: m.pop("index")), "manifest.json lacks index"),
    "no shard sha256": (lambda f: _edit_manifest(f, lambda m: m["shards"][0].pop("sha256")),
                        "lacks shards[0].sha256"),
    "a path as file name": (lambda f: _edit_manifest(f, lambda m: m["shards"][0].update(file="../x.bin")),
                            "'../x.bin' is not a plain name"),
    "a truncated manifest": (lambda f: (f / MANIFEST).write_text((f / MANIFEST).read_text()[:40]),
                             "manifest.json is damaged"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_shards_are_refused_naming_the_file(tmp_path, tok, damage):
    """Issue 27 item 2: what a prepared folder holds is checked before training: sizes, the manifest's keys, the
    index's ends on every open; checksums, token ids against the vocabulary, offsets increasing once per content."""
    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(10)))
    folder = tmp_path / "shards"
    write_shards(open_token_source(str(path), "data.train", separator="\n"), tok, folder)
    TokenShards.open(folder)
    change, message = DAMAGES[damage]
    change(folder)
    with pytest.raises(SourceError, match=re.escape(message)) as e:
        TokenShards.open(folder, where="data.train: shards")
    assert str(e.value).startswith("data.train: shards: ") and "prepare again" in str(e.value)


def test_contents_are_checked_once_per_content(tmp_path, tok, monkeypatch):
    from leantrain.data.lm import token_shards

    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(10)))
    folder = tmp_path / "shards"
    write_shards(open_token_source(str(path), "data.train", separator="\n"), tok, folder)
    hashed = []
    real = token_shards.sha256_file
    monkeypatch.setattr(token_shards, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))
    TokenShards.open(folder)
    assert hashed == []  # the writer recorded what it hashed while writing
    (folder / token_shards.VERIFIED).unlink()
    TokenShards.open(folder)
    TokenShards.open(folder)
    assert hashed == ["tokens-00000.bin", "documents.bin"]  # once, then recorded again
    _poke(folder / "tokens-00000.bin", 0, b"\x07\x00")
    os.utime(folder / "tokens-00000.bin", ns=(1, 1))  # a new stamp: checked again, and refused
    with pytest.raises(SourceError, match="does not match its sha256"):
        TokenShards.open(folder)


def test_training_on_a_damaged_folder_exits_2_before_the_model(tmp_path, tok, capsys):
    from leantrain.cli import main

    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(40)))
    folder = tmp_path / "shards"
    write_shards(open_token_source(str(path), "data.train", separator="\n"), tok, folder)
    _poke(folder / "tokens-00000.bin", 2, b"\xff\xff")
    code = main(["train", "model.task=causal-lm", "model.config_type=llama", f"model.tokenizer={tok.name_or_path}",
                 f"data.train={folder}", "data.block_size=8", f"output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2 and "tokens-00000.bin does not match its sha256" in err and "Traceback" not in err


def test_prepared_folder_is_a_source_and_checks_its_tokenizer(tmp_path, tok):
    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(10)))
    write_shards(open_token_source(str(path), "data.train", separator="\n"), tok, tmp_path / "shards")
    source = open_token_source(str(tmp_path / "shards"), "data.train")
    assert source.kind == "prepared"
    assert prepared_shards(source, tok).folder == tmp_path / "shards"
    other = AutoTokenizer.from_pretrained(make_tiny_lm_tokenizer(tmp_path / "tok2", words=["ba", "be"]))
    with pytest.raises(SourceError, match="another tokenizer"):
        prepared_shards(source, other)


def test_parallel_preparation_writes_the_same_shards(tmp_path, tok):
    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(300, seed=3)))
    source = open_token_source(str(path), "data.train", separator="\n")
    import leantrain.data.lm.shard_writer as ts

    one = write_shards(source, tok, tmp_path / "one", num_proc=1)
    old = ts.BATCH_DOCS
    ts.BATCH_DOCS = 50  # several batches in flight
    try:
        two = write_shards(source, tok, tmp_path / "two", num_proc=2, shard_tokens=1000)
    finally:
        ts.BATCH_DOCS = old
    assert len(two["shards"]) > 1
    assert stream(TokenShards.open(tmp_path / "one")) == stream(TokenShards.open(tmp_path / "two"))
    assert one["index"]["sha256"] == two["index"]["sha256"] and one["tokens"] == two["tokens"]


def test_lm_data_side_checks_before_the_model_and_names_the_file(tmp_path, tok):
    from leantrain.config import resolve
    from leantrain.data.lm import corpus
    from leantrain.errors import DataError

    csv = write_rows(tmp_path / "d.csv", [{"title": "a", "body": "ba be"}, {"title": "b", "body": "bi bo"}])
    cfg = resolve(None, [f"data.train={csv}", f"data.eval={tmp_path / 'missing.txt'}"])
    with pytest.raises(DataError) as e:
        corpus.load_and_validate(cfg.data, seed=0, batch_size=2)
    assert "data.train" in str(e.value.problems) and "data.text_column" in str(e.value.problems)
    assert "data.eval: file not found" in str(e.value.problems)  # every problem at once
    with pytest.raises(DataError, match="needs training text"):
        corpus.load_and_validate(resolve(None, []).data, seed=0, batch_size=2)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("ba be\n".encode() * 10 + "caf\xe9".encode("latin-1"))
    cfg = resolve(None, [f"data.train={bad}", f"data.cache_dir={tmp_path / 'cache'}", "data.block_size=4"])
    split = corpus.load_and_validate(cfg.data, seed=0, batch_size=2).train
    with pytest.raises(DataError) as e:
        corpus.process(split, tok, cfg.data)
    assert "latin1.txt: not UTF-8" in str(e.value.problems)
    assert not list((tmp_path / "cache").rglob("manifest.json"))  # nothing half-prepared is left as ready
    short = tmp_path / "short.txt"
    short.write_text("ba be bi")
    cfg = resolve(None, [f"data.train={short}", f"data.cache_dir={tmp_path / 'cache'}", "data.block_size=8"])
    with pytest.raises(DataError, match="4 tokens make 0 block"):
        corpus.process(corpus.load_and_validate(cfg.data, seed=0, batch_size=2).train, tok, cfg.data)


def _prepare_in_child(corpus: str, tok_folder: str, cache: str, queue) -> None:  # noqa: ANN001
    from leantrain.data.caches import using_cache_dir as using

    tokenizer = AutoTokenizer.from_pretrained(tok_folder)
    with using(cache):
        shards = prepared_shards(open_token_source(corpus, "data.train", separator="\n"), tokenizer)
        queue.put((str(shards.folder), shards.read(0, shards.n_tokens).tolist()))


def test_two_processes_preparing_at_once_end_with_one_folder(tmp_path, tok):
    """Without main_process_first (two runs started together): each prepares into its own temporary folder and
    renames it into place; the loser keeps the winner's folder. Both read the same shards; nothing is left over."""
    import multiprocessing as mp

    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(400)))
    ctx = mp.get_context("fork")  # fast to start; each child loads its own tokenizer
    queue = ctx.Queue()
    procs = [ctx.Process(target=_prepare_in_child, args=(str(path), tok.name_or_path, str(tmp_path / "cache"), queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1]
    assert [p.name for p in (tmp_path / "cache" / "leantrain-token-shards").iterdir()] == [Path(results[0][0]).name]


def _stalled_prepare(corpus: str, tok_folder: str, cache: str, written) -> None:  # noqa: ANN001
    """Prepare in batches of 5 documents, stalling for good once some tokens are on disk: before each batch, look
    at the temporary folder; once a token file has bytes, set ``written`` and wait forever."""
    import threading

    import leantrain.data.lm.shard_writer as ts
    from leantrain.data.caches import using_cache_dir as using

    encode = ts.encode_documents
    ts.BATCH_DOCS = 5
    root = Path(cache) / "leantrain-token-shards"

    def stall_once_written(*args, **kwargs):  # noqa: ANN002, ANN003
        if any(p.stat().st_size > 0 for p in root.glob("*.tmp-*/tokens-*.bin")):
            written.set()
            threading.Event().wait()  # never set: the parent kills this process here
        return encode(*args, **kwargs)

    ts.encode_documents = stall_once_written
    with using(cache):
        prepared_shards(open_token_source(corpus, "data.train", separator="\n"),
                        AutoTokenizer.from_pretrained(tok_folder))


def test_a_killed_preparation_is_never_used(tmp_path, tok):
    """SIGKILL a preparation half-way: its temporary folder is not the cache entry; the next run prepares again
    (and removes the dead process's folder)."""
    import multiprocessing as mp
    import signal

    path = tmp_path / "c.txt"
    path.write_text("\n".join(lm_documents(2000)))
    root = tmp_path / "cache" / "leantrain-token-shards"
    ctx = mp.get_context("fork")
    written = ctx.Event()
    child = ctx.Process(target=_stalled_prepare, args=(str(path), tok.name_or_path, str(tmp_path / "cache"), written))
    child.start()
    assert written.wait(timeout=120), "the preparation did not write its first batch"
    assert any(p.stat().st_size > 0 for p in root.glob("*.tmp-*/tokens-*.bin"))  # half-way: tokens written
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    tmp = next(root.glob("*.tmp-*"))
    assert not (tmp / MANIFEST).exists() and [p for p in root.iterdir() if ".tmp-" not in p.name] == []
    with using_cache_dir(tmp_path / "cache"):
        shards = prepared_shards(open_token_source(str(path), "data.train", separator="\n"), tok)
    assert shards.n_documents == 2000 and tok.decode(stream(shards)).count("<eos>") == 2000
    assert sorted(p.name for p in root.iterdir()) == [shards.folder.name]  # the dead one's folder is gone


def test_splits_of_a_dataset_folder(tmp_path):
    import datasets

    docs = lm_documents(6)
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs[:4], "n": list(range(4))}),
                          "validation": datasets.Dataset.from_dict({"text": docs[4:], "n": [4, 5]})}
                         ).save_to_disk(tmp_path / "ds")
    spec = str(tmp_path / "ds")
    assert list(open_token_source(spec, "data.train").documents()) == docs[:4]
    assert list(open_token_source(spec, "data.eval", split=None, eval_split=True).documents()) == docs[4:]
    assert list(open_token_source(spec, "data.eval", split="train", eval_split=True).documents()) == docs[:4]
    with pytest.raises(SourceError, match="data.eval_split"):
        open_token_source(spec, "data.eval", split="test", eval_split=True)
