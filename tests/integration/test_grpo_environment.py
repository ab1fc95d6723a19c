"""Multi-turn GRPO with an environment (``grpo.environment``) end to end, on the tiny Llama and chat tokenizer of
test_grpo_train.py: episodes of several turns through the real generation engine (the environment answers every
turn, so a random model's episodes go on), the environment's tokens attended but not trained, the step metrics and
the whole episodes in completions.jsonl, the evaluation, bad environments exiting 2 by name, and a resume that is
bitwise (the environment is made anew for each episode from its row: no state of its own to checkpoint)."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from leantrain import train
from leantrain.cli import main
from leantrain.report.logs import read_metrics
from tests.helpers import cli_here, cli_process, grpo_args, model_params, train_here, write_grpo_files

ENVIRONMENTS = '''
from leantrain.environments import Environment, ToolEnvironment


class Chatty(Environment):
    """Answers every turn with a question; done after the model's third turn, rewarded 1 when that answer has a
    digit."""

    def reset(self, row):
        self.row = row
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": row["prompt"]}]

    def step(self, messages, completion):
        turn = sum(m["role"] == "assistant" for m in messages) + 1
        if turn >= 3:
            return [], float(any(c.isdigit() for c in completion)), True
        return [{"role": "user", "content": f"Sure? It is {self.row['answer']}."}], None, False


class WordyReward(Chatty):
    def step(self, messages, completion):
        return [], "high", True


class BrokenReset(Chatty):
    def reset(self, row):
        raise KeyError("question")


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


class Calculator(ToolEnvironment):
    tools = (add,)

    def reward(self, messages, completion):
        return float(completion.strip() == str(self.row["answer"]))
'''
STEPS = 2


def env_args(root: Path, out: Path, env: str = "Chatty", *extra: str) -> list[str]:
    return grpo_args(root, out, f"grpo.environment={root / 'envs.py'}:{env}", "grpo.rewards=[]", "grpo.stop=[e,a,o]",
                     f"train.max_steps={STEPS}", *extra)


@pytest.fixture(scope="module")
def chatty(tmp_path_factory):
    """(root, the run's folder, its summary): 2 steps of 3-turn episodes (a stop string every few tokens ends each
    of the random model's turns)."""
    root = write_grpo_files(tmp_path_factory.mktemp("grpo-env"))
    (root / "envs.py").write_text(ENVIRONMENTS)
    out = root / "chatty"
    return root, out, train(None, env_args(root, out, "Chatty", "grpo.max_turns=3", "grpo.max_episode_tokens=128"))


def test_episodes_take_several_turns_and_are_logged_whole(chatty):
    _, out, summary = chatty
    rows = [r for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert 1 < r["episodes/turns"] <= 3 and r["episodes/tool_calls"] == 0 and r["episodes/tool_errors"] == 0
        assert r["episodes/length"] > 0 and "rewards/environment/mean" in r
        assert r["time_split"]["environment"] >= 0 and r["time_split"]["generation"] > 0
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    episode = samples[0]["episode"]
    assert episode[0] == {"role": "system", "content": "Be brief."} and episode[1]["role"] == "user"
    assert [m["role"] for m in episode[2:4]] == ["assistant", "user"] and "Sure? It is" in episode[3]["content"]
    assert samples[0]["turns"] == sum(m["role"] == "assistant" for m in episode)
    assert summary["train"]["generation"]["environment"].endswith("envs.py:Chatty")
    assert summary["train"]["generation"]["max_turns"] == 3
    assert summary["eval"]["samples"] == 4 and "episodes/turns" in summary["eval"]
    record = json.loads((out / "model" / "config.json").read_text())["grpo"]
    assert record["environment"].endswith("envs.py:Chatty") and record["max_turns"] == 3


def test_keeping_the_cache_between_turns_samples_what_re_prefilling_samples(chatty):
    """grpo.episode_cache=keep (the default, the chatty run) continues each episode's cache at a later turn;
    prefill encodes the whole episode again. In fp32 their logits agree to rounding, so the same draws give the same
    episodes, rewards and metrics (the loss too: the same tokens are trained), and the sampler's log-probs match the
    training forward's as closely either way."""
    root, out, _ = chatty
    again = root / "prefilled"
    train(None, env_args(root, again, "Chatty", "grpo.max_turns=3", "grpo.max_episode_tokens=128",
                         "grpo.episode_cache=prefill"))
    episodes = [[json.loads(line)["episode"] for line in (o / "completions.jsonl").read_text().splitlines()]
                for o in (out, again)]
    assert episodes[0] == episodes[1] and len(episodes[0]) > 0
    kept, prefilled = [[r for r in read_metrics(o / "metrics.jsonl") if r["type"] == "train"] for o in (out, again)]
    for a, b in zip(kept, prefilled):
        for key in ("episodes/turns", "episodes/length", "rewards/environment/mean"):
            assert a[key] == b[key], key
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
    # the sampler's log-probs (the kept cache's) against the training forward's: fp32 rounding, as re-prefilled (a
    # continued turn one position off measures about 1e-4); "nan" on a step whose groups were all flat (no token
    # trained: grpo.skip_zero_advantage)
    gaps = [r["sampling/logp_diff_max"] for r in kept + prefilled if r["sampling/logp_diff_max"] != "nan"]
    assert len(gaps) >= 2 and max(gaps) < 1e-5


def test_the_environments_tokens_are_not_trained(chatty, monkeypatch):
    """One step's training rows: the tokens the model sampled are labelled, the environment's reply (the template's
    close of the turn, the user's message, the opening of the next turn) is attended (mask 1) but -100."""
    from leantrain.methods.grpo import rollout as G

    root, _, _ = chatty
    seen = []
    real = G.training_rows
    monkeypatch.setattr(G, "training_rows", lambda *a, **k: seen.append(real(*a, **k)) or seen[-1])
    train(None, env_args(root, root / "rows", "Chatty", "grpo.max_turns=3", "grpo.max_episode_tokens=128", "train.max_steps=1"))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(root / "tok")
    rows = seen[0]
    ids, mask, labels = rows["completion_ids"], rows["completion_mask"], rows["completion_labels"]
    reply = (mask == 1) & (labels == -100)
    assert reply.any() and (labels != -100).any()
    for i in range(ids.shape[0]):
        text = tok.decode(ids[i][reply[i]].tolist(), skip_special_tokens=False)
        if text:
            assert "<|im_start|>user\nSure? It is" in text and text.endswith("<|im_start|>assistant\n")
        assert "Sure? It is" not in tok.decode(ids[i][labels[i] != -100].tolist())


def test_a_tool_environment_runs_and_a_model_without_tool_calls_ends_after_one_turn(chatty):
    root, _, _ = chatty
    out = root / "calc"
    summary = train(None, env_args(root, out, "Calculator", "train.max_steps=1"))
    row = [r for r in read_metrics(out / "metrics.jsonl") if r["type"] == "train"][0]
    assert row["episodes/turns"] == 1 and row["episodes/tool_calls"] == 0  # a random model writes no <tool_call>
    assert summary["train"]["steps"] == 1


def test_a_reward_that_is_not_a_number_exits_2_naming_the_environment(chatty, capsys):
    root, _, _ = chatty
    assert main(["train", *env_args(root, root / "wordy", "WordyReward", "train.max_steps=1")]) == 2
    err = capsys.readouterr().err
    assert "WordyReward.step" in err and "'high'" in err and "finite number" in err and "Traceback" not in err


def test_a_reset_that_raises_exits_2_naming_the_file_and_row_before_the_model_loads(chatty, capsys):
    root, _, _ = chatty
    assert main(["train", *env_args(root, root / "broken", "BrokenReset")]) == 2
    err = capsys.readouterr().err
    assert "BrokenReset.reset failed: KeyError" in err and "train.jsonl" in err and "line 1" in err


def test_an_environment_that_does_not_load_and_episode_keys_without_one_exit_2(chatty, capsys):
    root, _, _ = chatty
    assert main(["train", *grpo_args(root, root / "x", f"grpo.environment={root / 'envs.py'}:Nope")]) == 2
    assert "grpo.environment" in capsys.readouterr().err
    assert main(["train", *grpo_args(root, root / "x", "grpo.max_turns=2")]) == 2
    assert "grpo.max_turns: for multi-turn episodes only" in capsys.readouterr().err


def _resume_args(root: Path, out: Path) -> list[str]:
    return env_args(root, out, "Chatty", "grpo.max_turns=3", "grpo.max_episode_tokens=128", "train.max_steps=4", "checkpoint.every_steps=2",
                    "checkpoint.keep=2")


@pytest.mark.slow
def test_sigkill_mid_run_resumes_bitwise(chatty):
    root, _, _ = chatty
    ref_dir, resumed_dir = root / "ref", root / "resumed"
    with ThreadPoolExecutor(1) as pool:
        killed_job = pool.submit(lambda: cli_process("train", *_resume_args(root, resumed_dir),
                                                     env={"LEANTRAIN_TEST_KILL_AT_STEP": "3"}, timeout=600))
        assert train_here(_resume_args(root, ref_dir))["train"]["steps"] == 4
        killed: subprocess.CompletedProcess = killed_job.result()
    assert killed.returncode == -9, killed.stderr[-3000:]
    final = cli_here("train", *_resume_args(root, resumed_dir))
    assert final.returncode == 0, final.stderr[-3000:]
    assert json.loads((resumed_dir / "summary.json").read_text())["train"]["resumed_from_step"] == 2
    keep = ("type", "step", "loss", "reward", "episodes/turns", "episodes/length", "grad_norm", "eval.reward")
    got, want = ([{k: r[k] for k in keep if k in r} for r in read_metrics(d / "metrics.jsonl")]
                 for d in (resumed_dir, ref_dir))
    assert got == want
    a, b = model_params(ref_dir), model_params(resumed_dir)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
