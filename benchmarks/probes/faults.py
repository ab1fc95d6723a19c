"""Kill a small training run at random moments, resume it each time, and check that nothing was lost.

    python -m benchmarks.probes.faults --faults 10 [--nproc 2] [--seed 0] [--workdir DIR]

What it does: builds a tiny random BERT (1 layer, hidden 16, dropout 0.1) and a small two-class CSV, trains it once
without interruption (the reference), then trains the same config in another folder while injecting ``--faults``
faults, each followed by a plain rerun of the same command (which resumes from the newest complete checkpoint):

- ``sigkill``: SIGKILL of the ``leantrain train`` process at a random moment of a random step after its newest
  checkpoint (the step, its save, an evaluation, or the final outputs). Checkpoints are written every 2 steps, so
  many kills land inside a save; the script counts those (a ``.tmp-step-*`` folder is left behind).
- ``crash-in-save``: the process dies half-way through a save (files written, no manifest) at a random
  checkpoint step ahead (the ``LEANTRAIN_TEST_CRASH_IN_SAVE`` hook).

At the end it compares the per-step losses, learning rates, grad norms, evaluations (metrics.jsonl) and the final
parameters (model/model.safetensors) bitwise with the reference and prints the counts. Exit status 0 when every
fault was survived with nothing lost and no process outlived a kill. With ``--nproc 2`` the SIGKILL goes to the
launcher, and torchrun and the workers must die with it (``left_running`` counts those that did not; gloo on
127.0.0.1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

STEPS = 40
WORDS = {"pos": ["great", "lovely", "superb", "fine"], "neg": ["awful", "bad", "broken", "poor"]}


def make_data(folder: Path) -> None:
    import csv

    rng = random.Random(0)
    folder.mkdir(parents=True, exist_ok=True)
    for name, n in (("train.csv", 48), ("dev.csv", 16)):
        with (folder / name).open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            for _ in range(n):
                lab = rng.choice(["pos", "neg"])
                w.writerow([" ".join(rng.choice(WORDS[lab]) for _ in range(rng.randint(1, 10))), lab])


def make_model(folder: Path) -> None:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from leantrain.modeling import packaged_model_path

    tok = AutoTokenizer.from_pretrained(packaged_model_path())
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=128, hidden_dropout_prob=0.1,
                        attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)


def command(work: Path, out: Path, nproc: int) -> list[str]:
    cmd = [sys.executable, "-m", "leantrain", "train", f"model.name={work / 'bert'}",
           f"data.train={work / 'data' / 'train.csv'}", f"data.eval={work / 'data' / 'dev.csv'}",
           "train.batch_size=8", f"train.max_steps={STEPS}", "train.eval_every_steps=12", "train.lr=2e-3",
           "train.log_every_steps=1", "checkpoint.every_steps=2", "checkpoint.keep=2", "report.plots=false",
           "report.progress=none", "efficiency.precision=fp32", f"output_dir={out}"]
    if nproc > 1:
        cmd += ["--nproc", str(nproc), "train.micro_batch_size=2"]
    return cmd


def env(extra: dict | None = None) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "GLOO_SOCKET_IFNAME": "lo", **(extra or {})}


def logged_steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("type") == "train":
            steps = max(steps, rec["step"])
    return steps


def newest_checkpoint(out: Path) -> int:
    root = out / "checkpoints"
    steps = [int(p.name[5:]) for p in root.glob("step-*") if (p / "manifest.json").is_file()] if root.is_dir() else []
    return max(steps, default=0)


def run_until_progress(cmd: list[str], out: Path, extra_env: dict | None = None) -> tuple[subprocess.Popen, float]:
    """Start a run; return it once it logged a step beyond its resume point (or ended), and when that was."""
    start_step, log = newest_checkpoint(out), out / "metrics.jsonl"
    started = time.time_ns()
    proc = subprocess.Popen(cmd, env=env(extra_env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and not (log.is_file() and log.stat().st_mtime_ns > started  # this run's log
                                       and logged_steps(out) > start_step):
        time.sleep(0.02)
    return proc, time.monotonic()


def trajectory(out: Path) -> list[dict]:
    keep = ("type", "step", "loss", "lr", "grad_norm", "eval.loss", "eval.accuracy")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: r[k] for k in keep if k in r} for r in map(json.loads, lines)]


def same_params(a: Path, b: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    pa, pb = load_file(str(a / "model" / "model.safetensors")), load_file(str(b / "model" / "model.safetensors"))
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=int, default=10)
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None, help="kept afterwards (default: a temporary folder)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="leantrain-faults-"))
    shutil.rmtree(work / "ref", ignore_errors=True)
    shutil.rmtree(work / "chain", ignore_errors=True)
    make_data(work / "data")
    make_model(work / "bert")

    ref, chain = work / "ref", work / "chain"
    proc, t0 = run_until_progress(command(work, ref, args.nproc), ref)
    _, err = proc.communicate()
    if proc.returncode != 0:
        print(err[-3000:], file=sys.stderr)
        return 1
    window = time.monotonic() - t0  # from the first logged step to the end, uninterrupted
    print(f"reference: {STEPS} steps, {args.nproc} process(es); {window:.1f} s from the first step to the end")

    counts = {"sigkill": 0, "sigkill_during_save": 0, "crash_in_save": 0, "resumes": 0, "runs": 0, "left_running": 0}
    cmd = command(work, chain, args.nproc)
    injected = chain_faults = survived = 0
    all_same = True
    while injected < args.faults:
        kind = "crash_in_save" if rng.random() < 0.3 else "sigkill"
        extra = None
        if kind == "crash_in_save":
            ahead = newest_checkpoint(chain) + 2 * rng.randint(1, 3)
            if ahead >= STEPS:
                kind = "sigkill"
            else:
                extra = {"LEANTRAIN_TEST_CRASH_IN_SAVE": str(ahead)}
        target = rng.randint(newest_checkpoint(chain) + 1, STEPS)  # kill during this step (or its save) ...
        proc, _ = run_until_progress(cmd, chain, extra)
        counts["runs"] += 1
        if kind == "sigkill":
            while proc.poll() is None and logged_steps(chain) < target - 1:
                time.sleep(0.005)
            deadline = time.monotonic() + rng.uniform(0, 1.5 * window / STEPS)  # ... at a random moment of it
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.002)
            if proc.poll() is None:
                try:
                    group = psutil.Process(proc.pid).children(recursive=True)  # torchrun and workers (--nproc)
                except psutil.NoSuchProcess:
                    group = []
                proc.send_signal(signal.SIGKILL)
                _, alive = psutil.wait_procs(group, timeout=60)
                counts["left_running"] += len(alive)
                for p in alive:  # would train on: take them down, and count it as a failure
                    p.kill()
        _, err = proc.communicate()
        if "resuming from" in err:
            counts["resumes"] += 1
        if proc.returncode == 0:  # finished before this fault (not counted): check the chain, start a fresh one
            same = trajectory(chain) == trajectory(ref) and same_params(chain, ref)
            survived, all_same = survived + (chain_faults if same else 0), all_same and same
            print(f"  the run finished before the {kind} (not counted): a chain of {chain_faults} fault(s) ended, "
                  f"bitwise equal to the reference: {same}; starting a fresh chain")
            shutil.rmtree(chain)
            chain_faults = 0
            continue
        if kind == "sigkill" and proc.returncode not in (-9, 137):
            print(f"unexpected exit status {proc.returncode}:\n{err[-3000:]}", file=sys.stderr)
            return 1
        in_save = kind == "sigkill" and any((chain / "checkpoints").glob(".tmp-step-*"))
        injected += 1
        chain_faults += 1
        counts[kind] += 1
        counts["sigkill_during_save"] += in_save
        print(f"  fault {injected}: {kind}{' (during a save)' if in_save else ''} after step "
              f"{logged_steps(chain)}; newest complete checkpoint: step {newest_checkpoint(chain)}")
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    counts["runs"] += 1
    counts["resumes"] += "resuming from" in proc.stderr
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    same = trajectory(chain) == trajectory(ref) and same_params(chain, ref)
    survived, all_same = survived + (chain_faults if same else 0), all_same and same
    all_same = all_same and counts["left_running"] == 0
    print(json.dumps({**counts, "faults_injected": injected, "survived_nothing_lost": survived,
                      "bitwise_equal": all_same, "nproc": args.nproc, "steps": STEPS}))
    print(f"faults injected: {injected}; survived with nothing lost: {survived} (final parameters and per-step "
          f"trajectory of every chain bitwise equal to the uninterrupted run: {all_same})")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
