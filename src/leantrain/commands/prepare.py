"""``leantrain prepare``: tokenise a causal LM's corpus into token shards ahead of time (on a login node, before a
multi-node job), then print what it holds: tokens, documents, tokens per document (min / median / p90 / max),
the blocks ``data.block_size`` cuts from it, and the folder, which ``leantrain train`` takes as ``data.train``."""

from __future__ import annotations

import json
from pathlib import Path

from leantrain.config import Config, resolve
from leantrain.data.caches import using_cache_dir
from leantrain.data.sources import SourceError
from leantrain.data.text_loader import data_error
from leantrain.data.lm.shard_cache import prepared_shards
from leantrain.data.lm.shard_writer import write_shards
from leantrain.data.lm.token_shards import MANIFEST, VERIFIED, TokenShards, read_manifest
from leantrain.data.lm.token_sources import open_token_source
from leantrain.engine.checkpoint import lock
from leantrain.engine.devices.accelerator import setup_logging
from leantrain.errors import UserError
from leantrain.modeling import model_name

SHARD_FILES = ("tokens-", "documents.bin", MANIFEST, ".manifest.json", VERIFIED, lock.LOCK_FILE)


def load_prepare_tokenizer(cfg: Config):  # noqa: ANN201
    """``model.tokenizer``, else ``model.name``'s tokenizer (a local folder or Hub id)."""
    from transformers import AutoTokenizer  # lazy: transformers loads for the command only

    if not cfg.model.tokenizer and not cfg.model.name:
        raise UserError("leantrain prepare needs the tokenizer: model.tokenizer=<folder or Hub id> (or model.name=...)")
    name = cfg.model.tokenizer or model_name(cfg.model)
    try:
        return AutoTokenizer.from_pretrained(name, revision=cfg.model.revision,
                                             trust_remote_code=cfg.model.trust_remote_code)
    except (OSError, ValueError) as e:
        key = "model.tokenizer" if cfg.model.tokenizer else "model.name"
        raise UserError(f"{key}={name}: could not load a tokenizer ({str(e).splitlines()[0]})") from None


def _check_output(folder: Path) -> None:
    """An output folder is new, empty, or a prepared folder (or what a killed preparation left): nothing else is
    overwritten."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise UserError(f"output_dir={folder}: exists and is not a folder")
    others = [p.name for p in folder.iterdir() if not p.name.startswith(SHARD_FILES)]
    if others:
        raise UserError(f"output_dir={folder}: holds other files ({', '.join(sorted(others)[:3])}); give a new or "
                        "empty folder, or a prepared one to replace")


def _prepare_into(out: Path, source, tokenizer, cfg: Config) -> TokenShards:  # noqa: ANN001
    """Prepare into output_dir, locked as ``train`` locks its folder: a second ``prepare`` (or a run) there exits
    2 naming the one at work instead of interleaving its files with it."""
    _check_output(out)
    out.mkdir(parents=True, exist_ok=True)
    lock.acquire(out)
    try:
        _check_output(out)  # again, now that no one else writes there
        write_shards(source, tokenizer, out, num_proc=cfg.data.num_proc, desc="Tokenizing")
        return TokenShards.open(out)
    finally:
        lock.release(out)


def prepare(sources: list[str], cfg: Config) -> tuple[TokenShards, dict]:
    """Prepare ``sources`` (else data.train) with the config's tokenizer into output_dir (else the cache)."""
    specs = sources or ([cfg.data.train] if cfg.data.train else [])
    if not specs:
        raise UserError("leantrain prepare needs the text to prepare: SOURCES (.txt files, globs, folders, or a "
                        "tabular/JSON file with data.text_column) or data.train=...")
    with using_cache_dir(cfg.data.cache_dir):
        try:
            source = open_token_source(specs, "prepare", text_column=cfg.data.text_column,
                                       separator=cfg.data.document_separator, split=cfg.data.train_split,
                                       quoting=cfg.data.quoting)
        except SourceError as e:
            raise data_error([str(e)]) from None
        if source.kind == "prepared":
            raise UserError(f"{specs[0]} is already prepared (it holds {MANIFEST}); train on it with "
                            f"data.train={specs[0]}")
        tokenizer = load_prepare_tokenizer(cfg)
        try:
            if cfg.output_dir:
                shards = _prepare_into(Path(cfg.output_dir).expanduser(), source, tokenizer, cfg)
            else:
                shards = prepared_shards(source, tokenizer, num_proc=cfg.data.num_proc, desc="Tokenizing")
        except SourceError as e:
            raise data_error([str(e)]) from None
    return shards, summary(shards, cfg.data.block_size)


def summary(shards: TokenShards, block_size: int) -> dict:
    m = shards.manifest
    blocks = shards.n_tokens // block_size
    return {"path": str(shards.folder), "tokens": m["tokens"], "documents": m["documents"],
            "skipped_blank_documents": m["skipped_blank_documents"], "dtype": m["dtype"],
            "tokens_per_document": m["tokens_per_document"], "block_size": block_size, "blocks": blocks,
            "tail_tokens_dropped": shards.n_tokens - blocks * block_size, "tokenizer": m["tokenizer"]["name"],
            "seconds": m["prepared"]["seconds"], "num_proc": m["prepared"]["num_proc"]}


def format_summary(s: dict) -> str:
    d = s["tokens_per_document"]
    lines = [
        f"tokens:     {s['tokens']:,} ({s['dtype']}; tokenizer {s['tokenizer']})",
        f"documents:  {s['documents']:,}" + (f" ({s['skipped_blank_documents']:,} blank ones skipped)"
                                             if s["skipped_blank_documents"] else ""),
        f"tokens per document (with EOS): min {d['min']:,}  median {d['median']:,}  p90 {d['p90']:,}  max {d['max']:,}"
        f"  (mean {d['mean']:,.1f})",
        f"blocks:     {s['blocks']:,} of data.block_size={s['block_size']}"
        + (f" ({s['tail_tokens_dropped']:,} tail tokens dropped)" if s["tail_tokens_dropped"] else ""),
        f"path:       {s['path']}",
        f"train on it: leantrain train model.task=causal-lm ... data.train={s['path']}",
    ]
    return "\n".join(lines)


def prepare_command(sources: list[str], config_file: str | None, overrides: list[str], *, as_json: bool = False) -> int:
    cfg = resolve(config_file, overrides)
    setup_logging(True)
    shards, s = prepare(sources, cfg)
    print(json.dumps(s, indent=1) if as_json else format_summary(s))
    return 0


__all__ = ["prepare", "prepare_command", "summary", "format_summary", "read_manifest"]
