"""GRPO's parts around its step (``grpo.py``): its resumable sampler, its data (the prompts, the reward functions'
dry run, the tokenizer it decodes with), its model binding (the precision context, the frozen reference, the memory
model's calibration batch), its evaluation (one greedy completion per prompt, scored) and its report (what the saved
model records, the card, the KV cache ``leantrain plan`` prices)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from contextlib import contextmanager

import numpy as np
import torch

from leantrain.methods.grpo import env_rows
from leantrain.methods.grpo import episodes as E
from leantrain.methods.grpo import flat_groups
from leantrain.methods.grpo import forward as F
from leantrain.methods.grpo import rewards as R
from leantrain.methods.grpo import rollout as G
from leantrain.methods.lm.causal_lm import CausalLM
from leantrain.modeling.fast_paths import DECODE_STEP, decided
from leantrain.modeling.generation import vllm_engine
from leantrain.modeling.generation.decode import pad_id, stop_ids
from leantrain.modeling.generation.fast_decode import copied_bytes
from leantrain.modeling.generation.stops import stop_strings
from leantrain.modeling.wrappers import unwrapped

RECORD = "grpo"  # config.json's field: the settings the policy was trained with (the card; eval's default rewards)
RECORDED = ("rewards", "reward_weights", "num_generations", "max_new_tokens", "loss", "scale_rewards", "advantage",
            "beta", "epsilon", "num_iterations", "stop", "environment", "max_turns", "max_episode_tokens",
            "tool_timeout")


@functools.lru_cache(maxsize=8)
def loaded_rewards(specs: tuple[str, ...], weights: tuple[float, ...] | None) -> tuple[R.Reward, ...]:
    """The reward functions, loaded once per run (``configured`` runs several times)."""
    return tuple(R.load_rewards(list(specs), None if weights is None else list(weights)))


class Sampler:
    """The method's resumable state: each process's sampling generator, seeded by the run's seed and the rank, made
    on the device at first use; its state checkpointed with the process's (``Step.state``)."""

    def __init__(self, seed: int, rank: int):
        self.seed = int(seed) * 1000003 + int(rank)
        self._generator: torch.Generator | None = None
        self._saved: torch.Tensor | None = None

    def generator(self, device: torch.device) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator(device=device)
            self._generator.manual_seed(self.seed)
            if self._saved is not None:
                self._generator.set_state(self._saved.cpu())
        return self._generator

    def state_dict(self) -> dict:
        state = self._generator.get_state() if self._generator is not None else self._saved
        return {"seed": torch.tensor(self.seed), **({"generator": state} if state is not None else {})}

    def load_state_dict(self, state: dict) -> None:
        self.seed = int(state["seed"])
        self._saved = state.get("generator")
        self._generator = None


@contextmanager
def on_first_forward(model, call):  # noqa: ANN001, ANN201 - a model, a callable or None
    """``call`` made once, at the first forward of ``model`` inside the context (nothing when None)."""
    if call is None:
        yield
        return

    def hook(module, args, kwargs):  # noqa: ANN001, ANN202
        handle.remove()
        call()

    handle = unwrapped(model).register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


class GrpoData(CausalLM.parts.data):
    def side(self):  # noqa: ANN201 - a Modality
        """The prompts' side; with an environment, each row's prompt its opening messages (``env_rows.opening``)."""
        side, env = super().side(), self.task.environment
        if env is None:
            return side
        opened = functools.partial(env_rows.opening, env)
        return dataclasses.replace(
            side, load_and_validate=lambda cfg, **kw: side.load_and_validate(cfg, opening=opened, **kw),
            load_rows=lambda path, cfg, **kw: side.load_rows(path, cfg, opening=opened, **kw))

    def check(self, columns: dict, cfg=None) -> None:  # noqa: ANN001 - a Config
        """The dry call of the reward functions on the data's first rows (``rewards.check_rewards``), before the model
        loads: a column a function needs that the data lacks, a wrong return, an exception."""
        rows = columns.get("first_rows")
        if cfg is not None and self.task.rewards and rows:
            R.check_rewards(list(self.task.rewards), rows, conversational=columns.get("prompt") == "messages")

    def generated_tokens(self) -> tuple[int, str]:
        g = self.task.grpo
        if g.environment is not None:
            return g.episode_tokens(), "grpo.max_episode_tokens" if g.max_episode_tokens else \
                "grpo.max_turns x grpo.max_new_tokens"
        return g.max_new_tokens, "grpo.max_new_tokens"

    def with_processor(self, processor):  # noqa: ANN001, ANN201 - a tokenizer; a Grpo
        """Bound to the run's tokenizer (the one its prompt batches are made with): the completions are decoded with it
        for the rewards."""
        return dataclasses.replace(self.task, processor=processor)

    def count(self, dataset, indices) -> int:  # noqa: ANN001
        """Prompts in these rows (the loss's own count is made with its batches: ``Step.batches``)."""
        return int((np.asarray(indices) >= 0).sum())


class GrpoModel(CausalLM.parts.model):
    def check_architecture(self, cfg, config) -> None:  # noqa: ANN001 - a leantrain Config, a transformers config
        """A causal LM's checks; with ``grpo.generation=vllm``, a model vLLM can generate for (exit 2 naming it)."""
        super().check_architecture(cfg, config)
        if cfg.grpo.generation == "vllm":
            where = f"model.name={cfg.model.name}" if cfg.model.name else "the model"
            vllm_engine.check_model(config, qlora=cfg.peft.method == "qlora", where=where)

    def bind(self, model, autocast=None):  # noqa: ANN001, ANN201 - a Grpo
        """Bound to the model as it starts training: its precision context (generation, evaluation) and, for a KL
        penalty without LoRA, a frozen copy of it (the reference)."""
        frozen = self.task.frozen_reference
        if self.task.reference == "live" and frozen is None:
            frozen = copy.deepcopy(unwrapped(model)).eval().requires_grad_(False)
        return dataclasses.replace(self.task, frozen_reference=frozen, policy_autocast=autocast)

    def calibration_batch(self, batch: dict) -> dict:
        """The memory model's m synthetic rows as a training micro-batch of m prompts, each cut at the prompt budget and
        followed by ``max_new_tokens`` of its tokens as the G completions, with what ``Step.batches`` adds
        (advantages, rollout values, old and reference log-probs as configured)."""
        g, ids = self.task.grpo, batch["input_ids"]
        width = min(ids.shape[1], self.task.prompt_tokens + g.max_new_tokens)
        span = min(g.max_new_tokens, width - 1)
        prompts = ids[:, :width - span]
        completions = ids[:, width - span:width].repeat_interleave(g.num_generations, 0)
        n, names = completions.shape[0], self.task.metric_names
        out = {F.PROMPT_IDS: prompts, F.PROMPT_MASK: torch.ones_like(prompts), F.COMPLETION_IDS: completions,
               F.COMPLETION_MASK: torch.ones_like(completions), F.COMPLETION_LABELS: completions,
               "loss_weight": ids.new_ones(n, dtype=torch.float32), "advantages": ids.new_ones(n, dtype=torch.float32),
               "rollout_values": ids.new_zeros((n, len(names)), dtype=torch.float32),
               G.SAMPLER_LOGPS: ids.new_zeros((n, span), dtype=torch.float32)}
        for key, wanted in (("old_logps", g.num_iterations > 1), ("ref_logps", g.beta > 0)):
            if wanted:
                out[key] = ids.new_zeros((n, span), dtype=torch.float32)
        return out

    def merge_check_value(self, model, batch: dict):  # noqa: ANN001, ANN201
        """The model's summed loss on the prompts themselves (a batch of prompts has no completions to score)."""
        mask = batch["prompt_attention_mask"]
        prompts = {"input_ids": batch["prompt_input_ids"], "attention_mask": mask,
                   "labels": batch["prompt_input_ids"].masked_fill(mask == 0, G.IGNORE)}
        return self.task.token_losses(model, prompts).sum()


class GrpoEvaluation(CausalLM.parts.evaluation):
    def outputs(self, model, batch: dict) -> tuple:  # noqa: ANN001
        """Per prompt: the weighted reward of its greedy completion and each function's score (fp64, NaN: none)."""
        greedy = dataclasses.replace(self.task.sampling, temperature=0.0)
        tok = self.task.tokenizer()
        if self.task.sync_weights is not None:  # another engine's copy of the weights, brought up to date
            self.task.sync_weights(model)
        ids, mask, stop = batch["prompt_input_ids"], batch["prompt_attention_mask"], stop_strings(tok, self.task.grpo.stop)
        with self.task.autocast():
            if self.task.environment is not None:  # an episode per prompt, greedy at every turn
                eps = E.run(model, ids, mask, E.prompt_rows(batch),
                            self.task.episode_settings(model),
                            num_generations=1, sampling=greedy, tokenizer=tok, eos_ids=stop_ids(model, tok),
                            pad_id=pad_id(tok), stop=stop)
            else:
                rollout = self.task.generate(model, ids, mask, num_generations=1, sampling=greedy,
                                             eos_ids=stop_ids(model, tok), pad_id=pad_id(tok), stop=stop)
        if self.task.environment is not None:
            s = G.score_episodes(batch, eps, tok, list(self.task.rewards), 1, step="in evaluation")
            extra = [eps.stats]
        else:
            s, extra = G.score(batch, rollout, tok, list(self.task.rewards), 1, step="in evaluation"), []
        values = torch.cat([s.rewards[:, None], torch.from_numpy(s.scores), *extra], dim=1)
        return (values.to(ids.device),)

    def batch(self, values: torch.Tensor) -> dict:
        names = [f"rewards/{r.name}" for r in self.task.rewards]
        if self.task.environment is not None:
            names += ["rewards/environment", *E.STATS]
        return {"reward": values[:, 0], **{n: values[:, 1 + j] for j, n in enumerate(names)}}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        n = len(values.get("reward", ()))
        return {**{k: float(np.nanmean(v)) if n and not np.isnan(v).all() else math.nan
                   for k, v in values.items()}, "samples": int(n)}

    def headline(self, ev: dict) -> str:
        return f"eval reward: {ev.get('reward', math.nan):.4f} ({ev.get('samples', 0)} prompts, greedy)"


class GrpoReport(CausalLM.parts.report):
    def summary(self, label_names: list[str]) -> dict:
        """summary.json's ``train.generation``: the engine that sampled the completions (``paths.decode_step`` is
        leantrain's own engine's step, which vLLM does not take); ``train.zero_advantage_groups``: whether the groups
        with every advantage 0 were trained or skipped (``flat_groups``)."""
        g = self.task.grpo
        engine = "vllm" if g.generation == "vllm" else "leantrain (decode.generate)"
        episodes = {"environment": g.environment, "max_turns": g.max_turns, "max_episode_tokens": g.episode_tokens(),
                    "tool_timeout": g.tool_timeout, "episode_cache": g.episode_cache} if g.environment else {}
        return {"generation": {"engine": engine, "max_new_tokens": g.max_new_tokens, "stop": list(g.stop),
                               "importance_sampling": self.task.corrects_sampling, **episodes},
                "zero_advantage_groups": "skipped" if flat_groups.skips(g) else "trained"}

    def saved_config(self, ev: dict | None) -> dict:
        g = self.task.grpo
        return {RECORD: {"rewards": list(g.rewards), "reward_weights": [r.weight for r in self.task.rewards],
                         **{k: getattr(g, k) for k in RECORDED[2:]}, "temperature": g.temperature}}

    def card_notes(self, model_config: dict) -> list[str]:
        rec = model_config.get(RECORD) or {}
        if not rec:
            return []
        rloo = ", RLOO's leave-one-out baseline" if rec.get("advantage") == "rloo" else ""
        return ["## GRPO", "", f"Rewards: {', '.join(rec.get('rewards') or [])}; {rec.get('num_generations')} "
                f"completions per prompt of at most {rec.get('max_new_tokens')} tokens, loss {rec.get('loss')}{rloo}, "
                f"beta {rec.get('beta')}.", ""]

    def card_rows(self, summary: dict, config: dict) -> list[tuple[str, object]]:
        data, ev = config.get("data") or {}, summary.get("eval") or {}
        rows = [("prompts", data.get("train")), ("eval prompts", data.get("eval")),
                ("final eval reward (greedy)", ev.get("reward"))]
        return [(k, v) for k, v in rows if v is not None]

    def plan(self, model, per_process: int, precision: str) -> dict:  # noqa: ANN001
        """What generation holds beside the weights and the optimizer state (``leantrain plan``): the KV cache of the
        step's prompts on a process (one generation, whatever the micro-batches) x G completions x (prompt +
        max_new_tokens) positions, keys and values of every layer
        in the model's compute precision; the fused decode step's weight copies (where the run takes it); the
        fp32 logits of one token per row, with the sampler's softmax and cumulative sums."""
        c, g = unwrapped(model).config, self.task.grpo
        heads = getattr(c, "num_attention_heads", 1)
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        rows = per_process * g.num_generations
        positions = self.task.prompt_tokens + g.episode_tokens()  # an episode: every turn after the prompt
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, next(unwrapped(model).parameters()).dtype)
        element = torch.empty((), dtype=dtype).element_size()
        per_position = 2 * c.num_hidden_layers * kv_heads * head_dim * element
        fused = decided(unwrapped(model), DECODE_STEP) == "fused"
        return {"grpo_generation": {
            "rows": rows, "positions": positions, "kv_cache_bytes": rows * positions * per_position,
            "decode_copies_bytes": copied_bytes(unwrapped(model), dtype) if fused else 0,
            "logits_bytes": rows * c.vocab_size * (4 + 4 + 8),  # fp32 logits, probabilities, fp64 cumulative sums
            "prompts": per_process}}
