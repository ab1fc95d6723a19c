"""GRPO (``model.task=grpo``): online reinforcement learning of a causal LM with group-relative advantages, as TRL's
GRPOTrainer (its settings, loss types and metric names: ``grpo.*``, ``config/grpo.py``).

Each global step (the method seam, ``method_seam``): the loaded micro-batches are prompts (the ``prompts`` data
side); ``step_batches`` samples ``grpo.num_generations`` completions of each with the model being trained
(``grpo_generation``: no_grad, eval mode, the run's precision, the method's own generator, resumed bitwise), scores
them with the reward functions (``grpo_rewards``), computes each completion's advantage against its group's
(``grpo_losses.advantages``) and builds the training micro-batches (``grpo_rollout``), with the log-probs of the
sampling model (``grpo.num_iterations`` > 1) and of the reference (``grpo.beta`` > 0: the same model with its LoRA
adapters off, else a frozen copy of the model as it started). Every forward of a training micro-batch encodes each
prompt once for its G completions where the model allows (``grpo_forward``). ``step_loss`` is the clipped surrogate
(+ beta x k3 KL) summed as the loss type says, over a count the step returns as a device scalar
(``grpo_losses.count``), so the loss is the same whatever the micro-batches and processes (but for ``bnpo``, per
micro-batch by definition); the engine runs ``grpo.num_iterations`` optimizer updates on the same rollouts.

Evaluation: one greedy completion per eval prompt, scored: ``eval.reward`` (the weighted reward, unscorable
completions left out) and ``eval.rewards/<fn>``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from leantrain.config.grpo import GRPO, check_grpo_keys
from leantrain.config.tasks import task_spec
from leantrain.methods.grpo import forward as F
from leantrain.methods.grpo import losses as L
from leantrain.methods.grpo import rewards as R
from leantrain.methods.grpo import rollout as G
from leantrain.methods.lm.causal_lm import CausalLM
from leantrain.modeling.generation.sampling import Sampling, backend
from leantrain.methods.seam import StepBatches
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.traits import Traits
from leantrain.modeling.wrappers import frozen_forward, unwrapped

RECORD = "grpo"  # config.json's field: the settings the policy was trained with (the card; eval's default rewards)
RECORDED = ("rewards", "reward_weights", "num_generations", "max_new_tokens", "loss", "scale_rewards", "beta",
            "epsilon", "num_iterations")


@functools.lru_cache(maxsize=8)
def loaded_rewards(specs: tuple[str, ...], weights: tuple[float, ...] | None) -> tuple[R.Reward, ...]:
    """The reward functions, loaded once per run (``configured`` runs several times)."""
    return tuple(R.load_rewards(list(specs), None if weights is None else list(weights)))


class Sampler:
    """The method's resumable state: each process's sampling generator, seeded by the run's seed and the rank, made
    on the device at first use; its state checkpointed with the process's (``Task.step_state``)."""

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
def _on_first_forward(model, call):  # noqa: ANN001, ANN202 - a model, a callable or None
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
    def check(self, columns: dict, cfg=None) -> None:  # noqa: ANN001 - a Config
        """The dry call of the reward functions on the data's first rows (``grpo_rewards.check_rewards``), before the
        model loads: a column a function needs that the data lacks, a wrong return, an exception."""
        rows = columns.get("first_rows")
        if cfg is not None and self.task.rewards and rows:
            R.check_rewards(list(self.task.rewards), rows, conversational=columns.get("prompt") == "messages")

    def generated_tokens(self) -> tuple[int, str]:
        return self.task.max_new_tokens, "grpo.max_new_tokens"

    def with_processor(self, processor) -> "Grpo":  # noqa: ANN001 - a tokenizer
        """Bound to the run's tokenizer (the one its prompt batches are made with): the completions are decoded with it
        for the rewards."""
        return dataclasses.replace(self.task, processor=processor)

    def count(self, dataset, indices) -> int:
        """Prompts in these rows (the loss's own count is made with its batches: ``step_batches``)."""
        return int((np.asarray(indices) >= 0).sum())


class GrpoReport(CausalLM.parts.report):
    def saved_config(self, ev: dict | None) -> dict:
        return {RECORD: {"rewards": list(self.task.reward_specs),
                         "reward_weights": [r.weight for r in self.task.rewards],
                         **{k: getattr(self.task, k) for k in RECORDED[2:]}, "temperature": self.task.sampling.temperature}}

    def card_notes(self, model_config: dict) -> list[str]:
        rec = model_config.get(RECORD) or {}
        if not rec:
            return []
        return ["## GRPO", "", f"Rewards: {', '.join(rec.get('rewards') or [])}; {rec.get('num_generations')} "
                f"completions per prompt of at most {rec.get('max_new_tokens')} tokens, loss {rec.get('loss')}, "
                f"beta {rec.get('beta')}.", ""]

    def card_rows(self, summary: dict, config: dict) -> list[tuple[str, object]]:
        data, ev = config.get("data") or {}, summary.get("eval") or {}
        rows = [("prompts", data.get("train")), ("eval prompts", data.get("eval")),
                ("final eval reward (greedy)", ev.get("reward"))]
        return [(k, v) for k, v in rows if v is not None]

    def plan(self, model) -> dict:
        """The KV cache generation holds beside training: micro-batch prompts x G completions x (prompt +
        max_new_tokens) positions, keys and values of every layer, in the model's compute precision."""
        c = unwrapped(model).config
        heads = getattr(c, "num_attention_heads", 1)
        kv_heads = getattr(c, "num_key_value_heads", None) or heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        rows = (self.task.micro_batch_size or 1) * self.task.num_generations
        positions = self.task.prompt_tokens + self.task.max_new_tokens
        element = 2 if self.task.precision in ("bf16", "fp16") else next(unwrapped(model).parameters()).element_size()
        per_position = 2 * c.num_hidden_layers * kv_heads * head_dim * element
        return {"grpo_generation": {"rows": rows, "positions": positions, "kv_cache_bytes": rows * positions *
                                    per_position, "micro_batch_size": self.task.micro_batch_size or "auto"}}


class GrpoModel(CausalLM.parts.model):
    def bind(self, model, autocast=None) -> "Grpo":
        """Bound to the model as it starts training: its precision context (generation, evaluation) and, for a KL
        penalty without LoRA, a frozen copy of it (the reference)."""
        frozen = self.task.frozen_reference
        if self.task.reference == "live" and frozen is None:
            frozen = copy.deepcopy(unwrapped(model)).eval().requires_grad_(False)
        return dataclasses.replace(self.task, frozen_reference=frozen, policy_autocast=autocast)

    def calibration_batch(self, batch: dict) -> dict:
        """The memory model's m synthetic rows as a training micro-batch of m prompts, each cut at the prompt budget and
        followed by ``max_new_tokens`` of its tokens as the G completions, with what ``step_batches`` adds
        (advantages, rollout values, old and reference log-probs as configured)."""
        ids = batch["input_ids"]
        width = min(ids.shape[1], self.task.prompt_tokens + self.task.max_new_tokens)
        span = min(self.task.max_new_tokens, width - 1)
        prompts = ids[:, :width - span]
        completions = ids[:, width - span:width].repeat_interleave(self.task.num_generations, 0)
        n, names = completions.shape[0], G.metric_names(list(self.task.rewards))
        out = {F.PROMPT_IDS: prompts, F.PROMPT_MASK: torch.ones_like(prompts), F.COMPLETION_IDS: completions,
               F.COMPLETION_MASK: torch.ones_like(completions), F.COMPLETION_LABELS: completions,
               "loss_weight": ids.new_ones(n, dtype=torch.float32), "advantages": ids.new_ones(n, dtype=torch.float32),
               "rollout_values": ids.new_zeros((n, len(names)), dtype=torch.float32)}
        for key, wanted in (("old_logps", self.task.num_iterations > 1), ("ref_logps", self.task.beta > 0)):
            if wanted:
                out[key] = ids.new_zeros((n, span), dtype=torch.float32)
        return out

    def merge_check_value(self, model, batch: dict):
        """The model's summed loss on the prompts themselves (a batch of prompts has no completions to score)."""
        mask = batch["prompt_attention_mask"]
        prompts = {"input_ids": batch["prompt_input_ids"], "attention_mask": mask,
                   "labels": batch["prompt_input_ids"].masked_fill(mask == 0, G.IGNORE)}
        return self.task.token_losses(model, prompts).sum()


class GrpoStep(CausalLM.parts.step):
    def state(self, seed: int, rank: int) -> Sampler:
        return Sampler(seed, rank)

    def batches(self, ctx, micro_batches: list[dict], count) -> StepBatches:  # noqa: ANN001 - a StepContext
        """Generate, score, compute advantages, build the training micro-batches (module docstring)."""
        model, acc = ctx.model, ctx.accelerator
        generator = ctx.state.generator(acc.device) if ctx.state is not None else None
        scored = [self.task.rollout(model, acc, b, generator, ctx.step + 1, ctx.generating if i == 0 else None)
                  for i, b in enumerate(micro_batches)]
        batch_std = G.global_std(scored, acc)
        made, tokens = [], 0
        for s in scored:
            adv, std = L.advantages(s.rewards, self.task.num_generations, self.task.scale_rewards, batch_std)
            rows = G.training_rows(s, adv, std, batch_std, self.task.pad_id(), self.task.mask_truncated, self.task.num_generations)
            with acc.autocast():
                if self.task.num_iterations > 1:
                    with frozen_forward(unwrapped(model)) as inner:
                        rows["old_logps"] = self.task.token_logps(inner, rows)
                if self.task.beta > 0:
                    rows["ref_logps"] = self.task.reference_logps(model, rows)
            made.append(rows)
            tokens += int(G.tokens(rows))
        units = torch.stack([L.count(self.task.completion_mask(b), b["loss_weight"], self.task.loss, self.task.max_new_tokens)
                             for b in made]).sum()
        return StepBatches(made, units, updates=self.task.num_iterations, tokens=tokens,
                           samples=G.samples(scored[0], list(self.task.rewards), self.task.log_completions) if scored else ())

    def loss(self, model, batch: dict) -> tuple:
        """The loss sum of a training micro-batch and TRL's step metrics: the rollout's (reward, ...), the clipped
        fraction, the KL (beta > 0) and the entropy of the completions (from the forward's log-softmax, when it has
        logits); every per-token value is one per completion position (``grpo_forward``)."""
        weights = batch["loss_weight"]
        losses, spread = F.completion_losses(self.task, model, batch, entropy=True)
        logps, mask = -losses, self.task.completion_mask(batch)
        old = batch.get("old_logps", logps.detach())
        per_token, clipped = L.surrogate(logps, old, batch["advantages"], self.task.epsilon, self.task.epsilon_high)
        metrics = G.rollout_metrics(batch["rollout_values"], weights, G.metric_names(list(self.task.rewards)))
        if self.task.beta > 0:
            kl = L.kl_k3(logps, batch["ref_logps"])
            per_token = per_token + self.task.beta * kl
            metrics["kl"] = L.masked_sum(kl.detach(), mask, weights)
        metrics["clip_ratio"] = L.masked_sum(clipped, mask, weights)
        if spread is not None:
            metrics["entropy"] = L.masked_sum(spread, mask, weights)
        return L.reduce(per_token, mask, weights, self.task.loss), metrics

    def forward_loss(self, model, batch: dict):
        """The loss of a training micro-batch (the memory model's calibration passes; ``step_loss``'s)."""
        return self.loss(model, batch)[0], None


class GrpoEvaluation(CausalLM.parts.evaluation):
    def outputs(self, model, batch: dict) -> tuple:
        """Per prompt: the weighted reward of its greedy completion and each function's score (fp64, NaN: none)."""
        greedy = dataclasses.replace(self.task.sampling, temperature=0.0)
        with self.task.autocast():
            rollout = backend(self.task.generation)(model, batch["prompt_input_ids"], batch["prompt_attention_mask"],
                                               num_generations=1, sampling=greedy, eos_ids=self.task.stop_ids(model),
                                               pad_id=self.task.pad_id())
        s = G.score(batch, rollout, self.task.tokenizer(), list(self.task.rewards), 1, step="in evaluation")
        values = torch.cat([s.rewards[:, None], torch.from_numpy(s.scores)], dim=1)
        return (values.to(batch["prompt_input_ids"].device),)

    def batch(self, values: torch.Tensor) -> dict:
        return {"reward": values[:, 0], **{f"rewards/{r.name}": values[:, 1 + j] for j, r in enumerate(self.task.rewards)}}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        n = len(values.get("reward", ()))
        return {**{k: float(np.nanmean(v)) if n and not np.isnan(v).all() else math.nan
                   for k, v in values.items()}, "samples": int(n)}

    def headline(self, ev: dict) -> str:
        return f"eval reward: {ev.get('reward', math.nan):.4f} ({ev.get('samples', 0)} prompts, greedy)"


@dataclasses.dataclass(frozen=True)
class Grpo(CausalLM):
    """Prompts -> sampled completions -> rewards -> advantages -> the clipped surrogate; ``grpo.*`` as its fields."""

    num_generations: int = 8
    max_new_tokens: int = 64
    loss: str = "dapo"
    scale_rewards: str = "group"
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    num_iterations: int = 1
    beta: float = 0.0
    sampling: Sampling = Sampling(64)
    mask_truncated: bool = False
    generation: str = "auto"
    log_completions: int = 4
    rewards: tuple = ()
    reference: str = "none"  # beta > 0: "adapter" (LoRA off) or "live" (a frozen copy); else none
    reward_specs: tuple = ()  # grpo.rewards as given (recorded with the model: eval's default)
    micro_batch_size: int | None = None  # prompts a micro-batch holds (``plan``: the KV cache), None: auto
    precision: str = "auto"  # efficiency.precision (``plan``: the KV cache's element size)
    prompt_tokens: int = 0  # the prompts' budget (data.max_prompt_length or block_size // 2)
    processor: object = dataclasses.field(default=None, compare=False, repr=False)  # the run's tokenizer
    frozen_reference: object = dataclasses.field(default=None, compare=False, repr=False)  # live: the frozen copy
    policy_autocast: object = dataclasses.field(default=None, compare=False, repr=False)  # the policy's precision

    # -- settings
    parts = dataclasses.replace(CausalLM.parts, data=GrpoData, report=GrpoReport, model=GrpoModel, step=GrpoStep,
                                evaluation=GrpoEvaluation)

    def configured(self, cfg, model_config=None) -> "Grpo":
        """The run's ``grpo.*``; with a trained model's ``model_config`` (``leantrain eval``), what it recorded
        (rewards, ``max_new_tokens``, ...) for each key not given."""
        rec = (getattr(model_config, RECORD, None) or {}) if model_config is not None else {}
        given = cfg.grpo.model_fields_set | ({"reward_weights"} if "rewards" in cfg.grpo.model_fields_set else set())
        g = cfg.grpo.model_copy(update={k: v for k, v in rec.items() if k not in given})
        specs, weights = g.rewards, g.reward_weights
        micro = cfg.train.micro_batch_size
        return dataclasses.replace(
            self, num_generations=g.num_generations, max_new_tokens=g.max_new_tokens, loss=g.loss,
            scale_rewards=g.scale_rewards, epsilon=g.epsilon, epsilon_high=g.resolved_epsilon_high(),
            num_iterations=g.num_iterations, beta=g.beta,
            sampling=Sampling(g.max_new_tokens, g.temperature, g.top_p, g.top_k), mask_truncated=g.mask_truncated,
            generation=g.generation, log_completions=g.log_completions,
            rewards=loaded_rewards(tuple(specs), None if weights is None else tuple(weights)) if specs else (),
            reward_specs=tuple(specs), precision=cfg.efficiency.precision,
            reference="none" if g.beta == 0 else "adapter" if cfg.peft.method != "none" else "live",
            micro_batch_size=micro if isinstance(micro, int) else None,
            prompt_tokens=cfg.data.max_prompt_length or cfg.data.block_size // 2)

    def check_config(self, cfg, task: Task) -> None:  # noqa: ANN001 - a Config
        check_grpo_keys(cfg, task)

    # -- the model's tokenizer and the reference

    def tokenizer(self):  # noqa: ANN201 - a tokenizer
        """The model's tokenizer, as the data side's collator was given it."""
        if self.processor is None:
            raise RuntimeError("GRPO decodes its completions with the run's tokenizer: bind it first "
                               "(task.data.with_processor)")
        return self.processor

    def stop_ids(self, model) -> list[int]:
        """The ids that end a completion: the tokenizer's EOS and the model's generation config's."""
        tok = self.tokenizer()
        found = getattr(getattr(unwrapped(model), "generation_config", None), "eos_token_id", None)
        ids = [tok.eos_token_id] + (found if isinstance(found, list) else [found])
        return sorted({int(i) for i in ids if i is not None})

    def pad_id(self) -> int:
        tok = self.tokenizer()
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id or 0)

    def autocast(self):  # noqa: ANN201 - a context manager
        return self.policy_autocast() if self.policy_autocast is not None else nullcontext()

    def reference_logps(self, model, batch: dict) -> torch.Tensor:
        """The reference's per-token log-probs of a training micro-batch (``token_logps``): the model with its adapters
        off, or the frozen copy."""
        if self.reference == "live":
            ref, context = self.frozen_reference.to(batch[F.PROMPT_IDS].device), self.autocast()
        else:
            ref = unwrapped(model)
            context = ref.disable_adapter() if hasattr(ref, "disable_adapter") else nullcontext()
        with context, frozen_forward(ref):
            return self.token_logps(ref, batch)

    # -- the method seam

    def rollout(self, model, accelerator, batch: dict, generator, step: int,  # noqa: ANN001
                generating=None) -> G.Scored:  # noqa: ANN001 - a callable or None
        """One micro-batch of prompts answered ``num_generations`` times and scored; ``generating`` (fault
        injection, ``StepContext.generating``) called at the generation's first forward."""
        with accelerator.autocast(), _on_first_forward(model, generating):
            rollout = backend(self.generation)(
                model, batch["prompt_input_ids"], batch["prompt_attention_mask"], num_generations=self.num_generations,
                sampling=self.sampling, eos_ids=self.stop_ids(model), pad_id=self.pad_id(), generator=generator)
        return G.score(batch, rollout, self.tokenizer(), list(self.rewards), self.num_generations, step)

    def token_logps(self, model, batch: dict) -> torch.Tensor:
        """The per-token log-probs of a training micro-batch's completions (rows, C: ``grpo_forward``)."""
        return -F.completion_losses(self, model, batch)[0]

    @staticmethod
    def completion_mask(batch: dict) -> torch.Tensor:
        """1 on the completion tokens that weigh in the loss (rows, C)."""
        return (batch[F.COMPLETION_LABELS] != G.IGNORE).long()

    # -- evaluation


GRPO_TASK = register(Grpo(
    task_spec(GRPO),
    # advantages weigh a row's tokens by its sign: no Liger (efficiency.chunked_loss); tokens/s: prompt + completion
    Traits(labels="prompts", unit="tokens", auto_model="AutoModelForCausalLM", loads_as="text-generation",
           speed_unit="tokens", token_blocks=True, uniform_token_gradients=False, scratch_needs_tokenizer=True,
           progress_keys=("reward", "reward_std", "kl"), default_for=("prompts",)),
    CardText("reinforcement learning (GRPO)", "language model trained with GRPO", '"What is 2 + 3?", max_new_tokens=40')))
