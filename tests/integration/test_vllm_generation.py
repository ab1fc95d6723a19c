"""vLLM as GRPO's generation engine (``grpo.generation=vllm``, ``modeling/generation/vllm_engine.py``), with the real
vLLM, in the environment that has it (``make test-vllm``: ``.venv-vllm``, vllm-cpu 0.32 beside transformers < 5.20);
skipped elsewhere. On a tiny Llama in fp32 with attention heads of 32 dimensions (vLLM's CPU attention refuses 16):
vLLM's greedy tokens are leantrain's engine's, before and after the trained model's weights change (the push), with
LoRA merged; its log-probs are the trainer's raw ones; a 2-step GRPO run completes. One engine is built for the module
(about 5 s on 2 cores with a 1 GiB KV cache) and shared by its tests, as a run shares one."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed here: make test-vllm runs these tests in .venv-vllm")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: vLLM's CPU default takes nearly all the memory

from leantrain.modeling.generation.decode import generate  # noqa: E402
from leantrain.report.logs import read_metrics  # noqa: E402
from leantrain.modeling.generation.sampling import Sampling  # noqa: E402
from leantrain.modeling.generation.vllm_engine import Engine, VllmSettings  # noqa: E402
from leantrain.modeling.generation.vllm_engine import generate as vllm_generate  # noqa: E402
from tests.helpers import cli_here, grpo_args, make_tiny_llama, make_tiny_lm_tokenizer, write_grpo_files  # noqa: E402

pytestmark = pytest.mark.vllm
EOS = 1  # make_tiny_lm_tokenizer's <eos>
LOGP_TOLERANCE = 1e-4  # fp32, the same weights: vLLM's kernels (oneDNN, its attention) against torch's, measured ~1e-6


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("vllm")
    folder = make_tiny_llama(root / "llama", make_tiny_lm_tokenizer(root / "tok"), hidden=128)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three left-padded prompts of 3, 5 and 6 tokens (ids of the tiny vocabulary), pad 0."""
    ids = torch.tensor([[0, 0, 0, 5, 6, 7], [0, 9, 10, 11, 12, 13], [20, 21, 22, 23, 24, 25]])
    return ids, (ids != 0).long()


def both(model, sampling: Sampling, generations: int = 1, generator=None):  # noqa: ANN001, ANN201
    """(vLLM's rollout, leantrain's) of the prompts."""
    ids, mask = prompts()
    args = dict(num_generations=generations, sampling=sampling, eos_ids=[EOS], pad_id=0)
    return vllm_generate(model, ids, mask, **args, generator=generator), generate(model, ids, mask, **args)


def test_greedy_tokens_and_logps_are_leantrains_and_follow_the_trained_weights(llama):
    greedy = Sampling(max_new_tokens=12, temperature=0.0)
    ours, theirs = both(llama, greedy)
    assert ours.completion_ids.tolist() == theirs.completion_ids.tolist()
    assert ours.completion_mask.tolist() == theirs.completion_mask.tolist()
    assert ours.truncated.tolist() == theirs.truncated.tolist()
    assert torch.allclose(ours.logps, theirs.logps, atol=LOGP_TOLERANCE, rtol=0)
    before = ours.completion_ids
    with torch.no_grad():  # a training step's worth of change, in place as an optimizer makes it
        generator = torch.Generator().manual_seed(1)
        for p in llama.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)
    ours, theirs = both(llama, greedy)
    assert ours.completion_ids.tolist() == theirs.completion_ids.tolist()
    assert torch.allclose(ours.logps, theirs.logps, atol=LOGP_TOLERANCE, rtol=0)
    assert ours.completion_ids.tolist() != before.tolist()  # the push reached vLLM


def test_the_weights_are_pushed_only_when_they_changed(llama):
    greedy = Sampling(max_new_tokens=4, temperature=0.0)
    both(llama, greedy)
    engine = Engine.current(llama, VllmSettings())
    seen = engine.signature
    both(llama, greedy)
    assert engine.signature is seen  # unchanged weights: nothing pushed
    with torch.no_grad():
        llama.lm_head.weight.mul_(1.0)
    both(llama, greedy)
    assert engine.signature is not seen and engine.signature != seen


def test_sampling_is_seeded_by_the_callers_generator_with_the_raw_logps(llama):
    hot = Sampling(max_new_tokens=8, temperature=1.5, top_k=20)
    ids, mask = prompts()
    args = dict(num_generations=4, sampling=hot, eos_ids=[EOS], pad_id=0)
    first = vllm_generate(llama, ids, mask, **args, generator=torch.Generator().manual_seed(7))
    again = vllm_generate(llama, ids, mask, **args, generator=torch.Generator().manual_seed(7))
    assert first.completion_ids.shape[0] == 12 and first.completion_ids.tolist() == again.completion_ids.tolist()
    assert len({tuple(r) for r in first.completion_ids[:4].tolist()}) > 1  # a prompt's 4 samples differ
    # each token's log-prob is the model's own (temperature 1, no top-k), as training computes it: score the
    # completions with the model and compare
    full = torch.cat([ids.repeat_interleave(4, 0), first.completion_ids], 1)
    attention = torch.cat([mask.repeat_interleave(4, 0), first.completion_mask], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = llama(input_ids=full, attention_mask=attention, position_ids=positions).logits.float()
    width = ids.shape[1]
    scored = logits[:, width - 1:-1].log_softmax(-1).gather(-1, first.completion_ids[..., None])[..., 0]
    scored = scored * first.completion_mask
    assert torch.allclose(first.logps, scored, atol=LOGP_TOLERANCE, rtol=0)


def test_lora_adapters_are_merged_into_the_pushed_weights(llama):
    import copy

    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(llama), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # adapters that change the greedy tokens (B starts at zero)
    greedy = Sampling(max_new_tokens=12, temperature=0.0)
    ours, theirs = both(model, greedy)
    assert ours.completion_ids.tolist() == theirs.completion_ids.tolist()
    assert torch.allclose(ours.logps, theirs.logps, atol=LOGP_TOLERANCE, rtol=0)
    plain, _ = both(llama, greedy)
    assert plain.completion_ids.tolist() != ours.completion_ids.tolist()


def test_a_grpo_run_generates_with_vllm(tmp_path):
    """Two optimizer steps of GRPO with vLLM sampling (heads of 64 dimensions), in this process; the run's greedy
    evaluation generates with vLLM too."""
    root = write_grpo_files(tmp_path)
    out = tmp_path / "run"
    wide = ["model.config_overrides.hidden_size=128", "model.config_overrides.intermediate_size=256"]
    done = cli_here("train", *grpo_args(root, out, *wide, "train.max_steps=2", "grpo.generation=vllm",
                                        "grpo.vllm_memory=0.01"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("type") == "train"]
    assert [r["step"] for r in train] == [1, 2] and all(0 < r["completions/mean_length"] <= 8 for r in train)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval"]["samples"] == 4
    generation = summary["train"]["generation"]
    assert generation["engine"] == "vllm" and generation["importance_sampling"] is True  # auto: on for vLLM
    # vLLM (fp32 here) against the trainer: the gap measured, and small; its weights pushed, timed apart
    assert all(r["sampling/logp_diff_max"] < 1e-3 and "weight_sync" in r["time_split"] for r in train)


def test_a_model_vllm_cannot_run_exits_2_before_training(tmp_path):
    """The tiny Llama of the GRPO tests has heads of 16 dimensions, which vLLM's CPU attention refuses."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("head sizes are checked for vLLM's CPU attention")
    root = write_grpo_files(tmp_path)
    done = cli_here("train", *grpo_args(root, tmp_path / "run", "grpo.generation=vllm"))
    assert done.returncode == 2 and "heads of 16 dimensions" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_vllm_run_stopped_by_sigterm_resumes(tmp_path):
    """4 steps; SIGTERM after step 2 (a checkpoint, exit 75), then the same command resumes from step 2 and finishes,
    a new engine built for it (the stopped run's was shut down with it), as in a new process: every step's numbers
    are the run's that never stopped. (They differed after the resume while the engine missed the fused optimizer's
    updates: the uninterrupted run sampled with stale weights, the resumed one with the loaded ones.)"""
    root = write_grpo_files(tmp_path)
    wide = ["model.config_overrides.hidden_size=128", "model.config_overrides.intermediate_size=256",
            "train.max_steps=4", "checkpoint.every_steps=1", "grpo.generation=vllm"]
    ref, resumed = tmp_path / "ref", tmp_path / "resumed"
    assert cli_here("train", *grpo_args(root, ref, *wide)).returncode == 0
    stopped = cli_here("train", *grpo_args(root, resumed, *wide), LEANTRAIN_TEST_SIGNAL_AT_STEP="TERM@2")
    assert stopped.returncode == 75 and not (resumed / "summary.json").exists(), stopped.stderr[-3000:]
    done = cli_here("train", *grpo_args(root, resumed, *wide))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((resumed / "summary.json").read_text())["train"]["resumed_from_step"] == 2
    keep = ("step", "loss", "reward", "reward_std", "completions/mean_length", "grad_norm")
    got, want = ([{k: r[k] for k in keep if k in r} for r in read_metrics(d / "metrics.jsonl") if r["type"] == "train"]
                 for d in (resumed, ref))
    assert [r["step"] for r in got] == [1, 2, 3, 4] and got == want


def test_what_vllm_cannot_run_is_refused_naming_it():
    """The checks of ``GrpoModel.check_architecture`` (before any weight loads): an architecture vLLM does not
    implement, QLoRA's 4-bit base weights; a Llama with heads of 64 dimensions passes."""
    from transformers import LlamaConfig

    from leantrain.errors import ConfigError
    from leantrain.modeling.generation.vllm_engine import check_model

    llama = LlamaConfig(hidden_size=128, num_attention_heads=2, architectures=["LlamaForCausalLM"])
    check_model(llama, where="model.name=tiny")
    with pytest.raises(ConfigError, match="model.name=x is a NoSuchForCausalLM .*which vLLM does not implement"):
        check_model(LlamaConfig(hidden_size=128, num_attention_heads=2, architectures=["NoSuchForCausalLM"]),
                    where="model.name=x")
    with pytest.raises(ConfigError, match="peft.method=qlora"):
        check_model(llama, qlora=True)
