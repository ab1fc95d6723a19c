"""Distillation end to end (``model.task=distill``): a tiny Llama from a config taught by a tiny saved Llama with the
same tiny chat tokenizer, arithmetic prompts with a ``completion``; half the steps on the student's own samples
(``distill.lmbda=0.5``). One run is shared by most assertions; the 2-process run is in test_tasks_distributed.py."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from leantrain import train
from leantrain.cli import main
from leantrain.report.logs import read_metrics
from tests.helpers import (cli_here, cli_process, distill_args, make_tiny_chat_tokenizer, make_tiny_llama,
                           model_params, train_here, write_distill_files)

STEPS = 4


@pytest.fixture(scope="module")
def distilled(tmp_path_factory):
    """(root, the run's folder, its summary): 4 steps, on- and off-policy, the eval's reward has_digit."""
    root = write_distill_files(tmp_path_factory.mktemp("distill"))
    out = root / "run"
    summary = train(None, distill_args(root, out, f"train.max_steps={STEPS}", "distill.lmbda=0.5",
                                       f"grpo.rewards=[{root / 'rewards.py'}:has_digit]"))
    return root, out, summary


def test_the_run_logs_its_metrics_and_completions_and_records_the_teacher(distilled):
    root, out, summary = distilled
    records = read_metrics(out / "metrics.jsonl")
    steps = [r for r in records if r["type"] == "train"]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        assert {"kl", "student_logp", "teacher_logp", "on_policy", "completions/mean_length"} <= set(r)
        assert r["kl"] == pytest.approx(r["loss"], rel=1e-6) and r["kl"] >= 0  # the loss is the mean divergence
        assert r["student_logp"] < 0 and r["teacher_logp"] < 0 and r["on_policy"] in (0.0, 1.0)
        assert ("generation" in r["time_split"]) == (r["on_policy"] == 1.0) and "teacher" in r["time_split"]
    assert {r["on_policy"] for r in steps} == {0.0, 1.0}  # seed 42's draws at lmbda 0.5: both kinds in 4 steps
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r["on_policy"] for r in steps}
    assert all(s["source"] == ("student" if by_step[s["step"]] else "data") for s in samples)
    assert {s["completion"] for s in samples if s["source"] == "data"} <= {str(a + b) for a in range(10)
                                                                          for b in range(10)}
    ev = summary["eval"]
    assert {"kl", "reverse_kl", "forward_kl", "student_logp", "teacher_logp", "reward", "rewards/has_digit"} <= set(ev)
    assert ev["kl"] == pytest.approx(ev["reverse_kl"], rel=1e-6)  # beta 1, temperature 1: the reverse KL
    assert ev["samples"] == 4 and ev["tokens"] > 0 and 0 <= ev["reward"] <= 1
    assert summary["train"]["distillation"]["teacher"] == str(root / "teacher")
    recorded = json.loads((out / "model" / "config.json").read_text())["distill"]
    assert recorded["teacher"] == str(root / "teacher") and recorded["lmbda"] == 0.5 and recorded["beta"] == 1.0
    card = (out / "model" / "README.md").read_text()
    assert "## Distillation" in card and f"Teacher: {root / 'teacher'}" in card and "reverse KL" in card


def test_leantrain_eval_gives_the_runs_final_eval_against_the_recorded_teacher(distilled, tmp_path):
    root, out, summary = distilled
    report = tmp_path / "m.json"
    assert main(["eval", str(out / "model"), f"data.eval={root / 'answered-eval.jsonl'}",
                 f"grpo.rewards=[{root / 'rewards.py'}:has_digit]", "--output", str(report)]) == 0
    got = json.loads(report.read_text())["eval"]
    for key in ("kl", "reverse_kl", "forward_kl", "student_logp", "teacher_logp", "reward"):
        assert got[key] == pytest.approx(summary["eval"][key], rel=1e-5, abs=1e-7), key
    # prompts alone evaluate too (the student writes the completions), and without rewards there is no reward
    assert main(["eval", str(out / "model"), f"data.eval={root / 'eval.jsonl'}", "--output", str(report)]) == 0
    got = json.loads(report.read_text())["eval"]
    assert got["reverse_kl"] >= 0 and "reward" not in got


def _final(out: Path) -> tuple[dict, list[float]]:
    return model_params(out), [r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"]


def test_the_loss_is_the_mean_per_token_whatever_the_micro_batches(distilled):
    """Off-policy (the data's completions: no sampling), 2 steps of 4 prompts: micro-batches of 4, 2 and 1 give the
    same losses and weights (each micro-batch's sum over the step's global token count)."""
    root, _, _ = distilled
    runs = [_final(root / f"micro{m}") for m in (4, 2, 1) if train(None, distill_args(
        root, root / f"micro{m}", "train.max_steps=2", "distill.lmbda=0", f"train.micro_batch_size={m}"))]
    (p4, l4), *others = runs
    for params, losses in others:
        assert losses == pytest.approx(l4, rel=1e-5)
        for k in p4:
            # atol: AdamW's first steps move a coordinate whose gradient is near 0 by up to lr x g / (|g| + eps), so
            # a summation-order difference of 1e-9 in such a gradient shows as ~1e-6 (measured: 1.7e-6 in one of
            # lm_head's 10,240); 1e-5 is 0.2% of the 2 steps' lr (3e-3 each), far below a wrong token count's effect
            torch.testing.assert_close(params[k], p4[k], rtol=1e-4, atol=1e-5, msg=k)


def _resume_args(root: Path, out: Path) -> list[str]:
    return distill_args(root, out, "model.config_overrides.attention_dropout=0.1", "train.epochs=1",
                        "distill.lmbda=0.5", "checkpoint.every_steps=2", "checkpoint.keep=2", "checkpoint.keep_final=2")


@pytest.mark.slow
def test_sigkill_mid_run_resumes_bitwise(distilled):
    """24 prompts, 4 a step: 6 steps; SIGKILL after step 5 -> resumes from the checkpoint of step 4: the same draws of
    whose completions, the same samples, the same dropout, bitwise the same metrics and weights."""
    root, _, _ = distilled
    ref_dir, resumed_dir = root / "ref", root / "resumed"
    with ThreadPoolExecutor(1) as pool:
        killed_job = pool.submit(cli_process, "train", *_resume_args(root, resumed_dir),
                                 env={"LEANTRAIN_TEST_KILL_AT_STEP": "5"}, timeout=600)
        assert train_here(_resume_args(root, ref_dir))["train"]["steps"] == 6
        killed = killed_job.result()
    assert killed.returncode == -9, killed.stderr[-3000:]
    final = cli_here("train", *_resume_args(root, resumed_dir))
    assert final.returncode == 0, final.stderr[-3000:]
    assert json.loads((resumed_dir / "summary.json").read_text())["train"]["resumed_from_step"] == 4
    keep = ("type", "step", "loss", "kl", "on_policy", "student_logp", "grad_norm", "eval.kl")
    got, want = ([{k: r[k] for k in keep if k in r} for r in read_metrics(d / "metrics.jsonl")]
                 for d in (resumed_dir, ref_dir))
    assert got == want and {r["on_policy"] for r in want if "on_policy" in r} == {0.0, 1.0}
    a, b = model_params(ref_dir), model_params(resumed_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _other_vocabulary_teacher(root: Path) -> Path:
    tok = make_tiny_chat_tokenizer(root / "tok-other", vocab_size=300)
    return make_tiny_llama(root / "teacher-other", tok)


@pytest.mark.parametrize("extra,says", [
    (["distill.teacher={root}/no-such-teacher"], "distill.teacher=.*no-such-teacher: the teacher does not load"),
    (["distill.teacher={other}"], r"distill.teacher=.*teacher-other: its tokenizer \(300 tokens\) is not the "
                                  r"student's .*cross-tokenizer distillation is not supported"),
    (["distill.beta=1.5"], r"distill.beta"),
    (["distill.lmbda=-0.1"], r"distill.lmbda"),
    (["distill.teacher=null"], r"distill.teacher: distill learns from a teacher model and none is given"),
    (["data.train={root}/train.jsonl", "distill.lmbda=0.5"],
     r"distill.lmbda=0.5: off-policy steps train on the data's completions, and data.train=.*train.jsonl has "
     r"prompts only"),
    (["model.task=causal-lm", "data.train={root}/answered.jsonl"], r"distill.max_new_tokens: for distillation .* "
                                                                   r"this run's task is causal-lm"),
])
def test_bad_input_exits_2_before_any_weight_loads_naming_the_key(distilled, extra, says):
    root, _, _ = distilled
    other = _other_vocabulary_teacher(root) if "{other}" in extra[0] else None
    args = distill_args(root, root / "bad", "train.max_steps=1")
    run = cli_here("train", *args, *(e.format(root=root, other=other) for e in extra))
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr
    import re

    assert re.search(says, run.stderr), run.stderr[-2000:]
    assert ", frozen" not in run.stderr and not (root / "bad" / "metrics.jsonl").exists()  # no teacher loaded


def test_seq_kd_trains_prompts_only_data_on_the_teachers_samples(distilled):
    root, _, _ = distilled
    out = root / "seq-kd"
    train(None, distill_args(root, out, "train.max_steps=2", "distill.lmbda=0", "distill.seq_kd=true",
                             f"data.train={root / 'train.jsonl'}", f"data.eval={root / 'eval.jsonl'}",
                             "distill.teacher_top_k=5", "distill.beta=0.5"))
    steps = [r for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"]
    assert all(r["on_policy"] == 0.0 and "generation" in r["time_split"] for r in steps)
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert {s["source"] for s in samples} == {"teacher"}
    assert json.loads((out / "model" / "config.json").read_text())["distill"]["teacher_top_k"] == 5


def test_plan_prices_the_teacher(distilled):
    root, _, _ = distilled
    run = cli_here("plan", *distill_args(root, root / "plan", "train.max_steps=1"), "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    teacher = json.loads(run.stdout)["distill_teacher"]
    params = sum(v.numel() for v in model_params_of(root / "teacher").values())
    assert teacher["teacher"] == str(root / "teacher") and teacher["parameters"] == params
    assert teacher["weights_bytes"] == 4 * params  # fp32 run: the teacher in fp32
    text = cli_here("plan", *distill_args(root, root / "plan", "train.max_steps=1"))
    assert f"teacher {root / 'teacher'}" in text.stdout and "training peak with it" in text.stdout


def model_params_of(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_the_process_stops_with_no_traceback_on_a_missing_teacher_at_eval(distilled, tmp_path):
    root, out, _ = distilled
    moved = tmp_path / "model"
    subprocess.run(["cp", "-r", str(out / "model"), str(moved)], check=True)
    config = json.loads((moved / "config.json").read_text())
    config["distill"]["teacher"] = str(root / "gone")
    (moved / "config.json").write_text(json.dumps(config))
    run = cli_here("eval", str(moved), f"data.eval={root / 'eval.jsonl'}")
    assert run.returncode == 2 and "Traceback" not in run.stderr and "gone" in run.stderr
