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
from leantrain.modeling.generation import decode
from leantrain.modeling.generation.decode import backend
from leantrain.modeling.generation.sampling import Sampling
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
    _tokenizer: list = dataclasses.field(default_factory=list, compare=False, repr=False)  # shared by its copies
    _frozen: list = dataclasses.field(default_factory=list, compare=False, repr=False)  # live: [the frozen copy]
    _autocast: object = dataclasses.field(default=None, compare=False, repr=False)

    # -- settings
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

    def check_data(self, columns: dict, cfg=None) -> None:  # noqa: ANN001 - a Config
        """The dry call of the reward functions on the data's first rows (``grpo_rewards.check_rewards``), before the
        model loads: a column a function needs that the data lacks, a wrong return, an exception."""
        rows = columns.get("first_rows")
        if cfg is not None and self.rewards and rows:
            R.check_rewards(list(self.rewards), rows, conversational=columns.get("prompt") == "messages")

    def generated_tokens(self) -> tuple[int, str]:
        return self.max_new_tokens, "grpo.max_new_tokens"

    def saved_config(self, ev: dict | None) -> dict:
        return {RECORD: {"rewards": list(self.reward_specs),
                         "reward_weights": [r.weight for r in self.rewards],
                         **{k: getattr(self, k) for k in RECORDED[2:]}, "temperature": self.sampling.temperature}}

    def card_notes(self, model_config: dict) -> list[str]:
        rec = model_config.get(RECORD) or {}
        if not rec:
            return []
        return ["## GRPO", "", f"Rewards: {', '.join(rec.get('rewards') or [])}; {rec.get('num_generations')} "
                f"completions per prompt of at most {rec.get('max_new_tokens')} tokens, loss {rec.get('loss')}, "
                f"beta {rec.get('beta')}.", ""]

    # -- the model's tokenizer and the reference
    def data_side(self, side):  # noqa: ANN001, ANN201 - a Modality
        """The prompts side, its collator remembering the tokenizer it is built with (the run's, or ``leantrain
        eval``'s): the completions are decoded with it for the rewards."""
        def collator(tokenizer, cfg, **kw):  # noqa: ANN001, ANN202
            self._tokenizer[:] = [tokenizer]
            return side.collator(tokenizer, cfg, **kw)

        return dataclasses.replace(side, collator=collator)

    def tokenizer(self):  # noqa: ANN201 - a tokenizer
        """The model's tokenizer, as the data side's collator was given it."""
        if not self._tokenizer:
            raise RuntimeError("GRPO decodes its completions with the run's tokenizer: build the data side's collator "
                               "(Grpo.data_side) first")
        return self._tokenizer[0]

    def stop_ids(self, model) -> list[int]:
        """The ids that end a completion: the tokenizer's EOS and the model's generation config's."""
        return decode.stop_ids(model, self.tokenizer())

    def pad_id(self) -> int:
        return decode.pad_id(self.tokenizer())

    def with_model(self, model, autocast=None) -> "Grpo":
        """Bound to the model as it starts training: its precision context (generation, evaluation) and, for a KL
        penalty without LoRA, a frozen copy of it (the reference)."""
        frozen = self._frozen
        if self.reference == "live" and not frozen:
            ref = copy.deepcopy(unwrapped(model)).eval().requires_grad_(False)
            frozen = [ref]
        return dataclasses.replace(self, _frozen=frozen, _autocast=autocast)

    def autocast(self):  # noqa: ANN201 - a context manager
        return self._autocast() if self._autocast is not None else nullcontext()

    def reference_logps(self, model, batch: dict) -> torch.Tensor:
        """The reference's per-token log-probs of a training micro-batch (``token_logps``): the model with its adapters
        off, or the frozen copy."""
        if self.reference == "live":
            ref, context = self._frozen[0].to(batch[F.PROMPT_IDS].device), self.autocast()
        else:
            ref = unwrapped(model)
            context = ref.disable_adapter() if hasattr(ref, "disable_adapter") else nullcontext()
        with context, frozen_forward(ref):
            return self.token_logps(ref, batch)

    # -- the method seam
    def step_state(self, seed: int, rank: int) -> Sampler:
        return Sampler(seed, rank)

    def step_batches(self, ctx, micro_batches: list[dict], count) -> StepBatches:  # noqa: ANN001 - a StepContext
        """Generate, score, compute advantages, build the training micro-batches (module docstring)."""
        model, acc = ctx.model, ctx.accelerator
        generator = ctx.state.generator(acc.device) if ctx.state is not None else None
        scored = [self.rollout(model, acc, b, generator, ctx.step + 1, ctx.generating if i == 0 else None)
                  for i, b in enumerate(micro_batches)]
        batch_std = G.global_std(scored, acc)
        made, tokens = [], 0
        for s in scored:
            adv, std = L.advantages(s.rewards, self.num_generations, self.scale_rewards, batch_std)
            rows = G.training_rows(s, adv, std, batch_std, self.pad_id(), self.mask_truncated, self.num_generations)
            with acc.autocast():
                if self.num_iterations > 1:
                    with frozen_forward(unwrapped(model)) as inner:
                        rows["old_logps"] = self.token_logps(inner, rows)
                if self.beta > 0:
                    rows["ref_logps"] = self.reference_logps(model, rows)
            made.append(rows)
            tokens += int(G.tokens(rows))
        units = torch.stack([L.count(self.completion_mask(b), b["loss_weight"], self.loss, self.max_new_tokens)
                             for b in made]).sum()
        return StepBatches(made, units, updates=self.num_iterations, tokens=tokens,
                           samples=G.samples(scored[0], list(self.rewards), self.log_completions) if scored else ())

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

    def step_loss(self, model, batch: dict) -> tuple:
        """The loss sum of a training micro-batch and TRL's step metrics: the rollout's (reward, ...), the clipped
        fraction, the KL (beta > 0) and the entropy of the completions (from the forward's log-softmax, when it has
        logits); every per-token value is one per completion position (``grpo_forward``)."""
        weights = batch["loss_weight"]
        losses, spread = F.completion_losses(self, model, batch, entropy=True)
        logps, mask = -losses, self.completion_mask(batch)
        old = batch.get("old_logps", logps.detach())
        per_token, clipped = L.surrogate(logps, old, batch["advantages"], self.epsilon, self.epsilon_high)
        metrics = G.rollout_metrics(batch["rollout_values"], weights, G.metric_names(list(self.rewards)))
        if self.beta > 0:
            kl = L.kl_k3(logps, batch["ref_logps"])
            per_token = per_token + self.beta * kl
            metrics["kl"] = L.masked_sum(kl.detach(), mask, weights)
        metrics["clip_ratio"] = L.masked_sum(clipped, mask, weights)
        if spread is not None:
            metrics["entropy"] = L.masked_sum(spread, mask, weights)
        return L.reduce(per_token, mask, weights, self.loss), metrics

    def forward_loss(self, model, batch: dict):
        """The loss of a training micro-batch (the memory model's calibration passes; ``step_loss``'s)."""
        return self.step_loss(model, batch)[0], None

    def calibration_batch(self, batch: dict) -> dict:
        """The memory model's m synthetic rows as a training micro-batch of m prompts, each cut at the prompt budget and
        followed by ``max_new_tokens`` of its tokens as the G completions, with what ``step_batches`` adds
        (advantages, rollout values, old and reference log-probs as configured)."""
        ids = batch["input_ids"]
        width = min(ids.shape[1], self.prompt_tokens + self.max_new_tokens)
        span = min(self.max_new_tokens, width - 1)
        prompts = ids[:, :width - span]
        completions = ids[:, width - span:width].repeat_interleave(self.num_generations, 0)
        n, names = completions.shape[0], G.metric_names(list(self.rewards))
        out = {F.PROMPT_IDS: prompts, F.PROMPT_MASK: torch.ones_like(prompts), F.COMPLETION_IDS: completions,
               F.COMPLETION_MASK: torch.ones_like(completions), F.COMPLETION_LABELS: completions,
               "loss_weight": ids.new_ones(n, dtype=torch.float32), "advantages": ids.new_ones(n, dtype=torch.float32),
               "rollout_values": ids.new_zeros((n, len(names)), dtype=torch.float32)}
        for key, wanted in (("old_logps", self.num_iterations > 1), ("ref_logps", self.beta > 0)):
            if wanted:
                out[key] = ids.new_zeros((n, span), dtype=torch.float32)
        return out

    def merge_check_value(self, model, batch: dict):
        """The model's summed loss on the prompts themselves (a batch of prompts has no completions to score)."""
        mask = batch["prompt_attention_mask"]
        prompts = {"input_ids": batch["prompt_input_ids"], "attention_mask": mask,
                   "labels": batch["prompt_input_ids"].masked_fill(mask == 0, G.IGNORE)}
        return self.token_losses(model, prompts).sum()

    def count(self, dataset, indices) -> int:
        """Prompts in these rows (the loss's own count is made with its batches: ``step_batches``)."""
        return int((np.asarray(indices) >= 0).sum())

    # -- evaluation
    def eval_outputs(self, model, batch: dict) -> tuple:
        """Per prompt: the weighted reward of its greedy completion and each function's score (fp64, NaN: none)."""
        greedy = dataclasses.replace(self.sampling, temperature=0.0)
        with self.autocast():
            rollout = backend(self.generation)(model, batch["prompt_input_ids"], batch["prompt_attention_mask"],
                                               num_generations=1, sampling=greedy, eos_ids=self.stop_ids(model),
                                               pad_id=self.pad_id())
        s = G.score(batch, rollout, self.tokenizer(), list(self.rewards), 1, step="in evaluation")
        values = torch.cat([s.rewards[:, None], torch.from_numpy(s.scores)], dim=1)
        return (values.to(batch["prompt_input_ids"].device),)

    def eval_batch(self, values: torch.Tensor) -> dict:
        return {"reward": values[:, 0], **{f"rewards/{r.name}": values[:, 1 + j] for j, r in enumerate(self.rewards)}}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        n = len(values.get("reward", ()))
        return {**{k: float(np.nanmean(v)) if n and not np.isnan(v).all() else math.nan
                   for k, v in values.items()}, "samples": int(n)}

    def headline(self, ev: dict) -> str:
        return f"eval reward: {ev.get('reward', math.nan):.4f} ({ev.get('samples', 0)} prompts, greedy)"

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
        rows = (self.micro_batch_size or 1) * self.num_generations
        positions = self.prompt_tokens + self.max_new_tokens
        element = 2 if self.precision in ("bf16", "fp16") else next(unwrapped(model).parameters()).element_size()
        per_position = 2 * c.num_hidden_layers * kv_heads * head_dim * element
        return {"grpo_generation": {"rows": rows, "positions": positions, "kv_cache_bytes": rows * positions *
                                    per_position, "micro_batch_size": self.micro_batch_size or "auto"}}


GRPO_TASK = register(Grpo(
    task_spec(GRPO),
    # advantages weigh a row's tokens by its sign: no Liger (efficiency.chunked_loss); tokens/s: prompt + completion
    Traits(labels="prompts", unit="tokens", auto_model="AutoModelForCausalLM", loads_as="text-generation",
           speed_unit="tokens", token_blocks=True, uniform_token_gradients=False, scratch_needs_tokenizer=True,
           progress_keys=("reward", "reward_std", "kl")),
    None, CardText("reinforcement learning (GRPO)", "language model trained with GRPO",
                   '"What is 2 + 3?", max_new_tokens=40'),
    default_for=("prompts",)))
