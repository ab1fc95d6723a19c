"""GRPO (``model.task=grpo``): online reinforcement learning of a causal LM with group-relative advantages, as TRL's
GRPOTrainer (its settings, loss types and metric names: ``grpo.*``, ``config/grpo.py``).

One global step, top to bottom (``GrpoStep``; the engine calls ``batches`` then ``loss`` per micro-batch):

1. **sample**: each prompt of the loaded micro-batches is answered ``grpo.num_generations`` times by the model being
   trained (``leantrain.modeling.generation``: no_grad, eval mode, the run's precision, the method's own generator,
   resumed bitwise);
2. **score**: the reward functions score each completion (``rewards``; ``rollout.score``);
3. **advantage**: each completion's reward against its group's mean (``grpo.advantage=rloo``: the mean of the
   group's other completions) (``losses.advantages``), made into training rows with the log-probs of the sampling
   model (``grpo.num_iterations`` > 1) and of the reference (``grpo.beta`` > 0: the same model with its LoRA adapters
   off, else a frozen copy of the model as it started) (``rollout.training_rows``);
4. **loss**: the clipped surrogate (+ beta x k3 KL) summed as the loss type says over a count the step returns as a
   device scalar (``losses.count``), so the loss is the same whatever the micro-batches and processes (but for
   ``bnpo``, per micro-batch by definition); every forward encodes each prompt once for its G completions where the
   model allows (``forward``). The engine runs ``grpo.num_iterations`` optimizer updates on the same rollouts.

Evaluation: one greedy completion per eval prompt, scored: ``eval.reward`` (the weighted reward, unscorable
completions left out) and ``eval.rewards/<fn>``. The parts around the step (data, binding, evaluation, report) are in
``parts.py``.
"""

from __future__ import annotations

import dataclasses
import functools
from contextlib import nullcontext

import torch

from leantrain.config.grpo import GRPO, GrpoConfig, check_grpo_keys
from leantrain.config.tasks import task_spec
from leantrain.environments import load_environment, schemas
from leantrain.methods.grpo import episodes as E
from leantrain.methods.grpo import flat_groups
from leantrain.methods.grpo import forward as F
from leantrain.methods.grpo import losses as L
from leantrain.methods.grpo import rollout as G
from leantrain.methods.grpo.env_tokens import tool_format
from leantrain.methods.grpo.parts import (RECORD, GrpoData, GrpoEvaluation, GrpoModel, GrpoReport, Sampler,
                                          loaded_rewards, on_first_forward)
from leantrain.methods.lm.causal_lm import CausalLM
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.seam import StepBatches
from leantrain.methods.traits import Traits
from leantrain.modeling.fast_paths import DECODE_STEP, SHARED_PROMPTS
from leantrain.modeling.generation import vllm_engine
from leantrain.modeling.generation.backends import backend, weight_sync
from leantrain.modeling.generation.decode import pad_id, stop_ids
from leantrain.modeling.generation.sampling import Sampling
from leantrain.modeling.generation.stops import stop_strings
from leantrain.modeling.wrappers import frozen_forward, unwrapped


class GrpoStep(CausalLM.parts.step):
    """sample -> score -> advantage (``batches``), then the loss of each training micro-batch (``loss``)."""

    def state(self, seed: int, rank: int) -> Sampler:
        return Sampler(seed, rank)

    def batches(self, ctx, micro_batches: list[dict], count) -> StepBatches:  # noqa: ANN001 - a StepContext
        """Sample the step's prompts (all this process's micro-batches in one generation), score each micro-batch,
        compute the advantages, build the training micro-batches."""
        model, acc, g = ctx.model, ctx.accelerator, self.task.grpo
        generator = ctx.state.generator(acc.device) if ctx.state is not None else None
        lap = ctx.lap or (lambda phase, synced=False: None)
        scored = self.sample_and_score(model, acc, micro_batches, generator, ctx.step + 1, lap, ctx.generating)
        batch_std = G.global_std(scored, acc)
        made, pad = [], pad_id(self.task.tokenizer())
        for s in scored:
            adv, std = L.advantages(s.rewards, g.num_generations, g.scale_rewards, batch_std, g.advantage)
            made.append(G.training_rows(s, adv, std, batch_std, pad, g.mask_truncated, g.num_generations))
        tokens = sum(int(G.tokens(rows)) for rows in made)  # every row's, and the loss's denominator over every row
        units = torch.stack([L.count(completion_mask(b), b["loss_weight"], g.loss, g.max_new_tokens)
                             for b in made]).sum()
        if flat_groups.skips(g):  # groups with every advantage 0 have no gradient: not computed
            made = flat_groups.trained(made, g.num_generations, pad, acc)
        for rows in made:
            with acc.autocast():
                if g.num_iterations > 1:
                    with frozen_forward(unwrapped(model)) as inner:
                        rows["old_logps"] = self.task.token_logps(inner, rows)
                if g.beta > 0:
                    rows["ref_logps"] = self.task.reference_logps(model, rows)
        lap("reference")  # the advantages, rows and the old and reference log-probs
        samples = functools.partial(G.samples, scored[0], list(self.task.rewards), g.log_completions) if scored else ()
        return StepBatches(made, units, updates=g.num_iterations, tokens=tokens, samples=samples)

    def sample_and_score(self, model, accelerator, batches: list[dict], generator, step: int, lap,  # noqa: ANN001
                         generating=None) -> list[G.Scored]:  # noqa: ANN001 - a callable or None
        """The prompts of ``batches`` (micro-batches) answered ``num_generations`` times in one generation (the
        training micro-batch is a memory choice; the decode batch is as wide as the step: a step costs as many decode
        steps whatever the micro-batches), then each micro-batch's completions scored; ``lap`` (``StepContext.lap``)
        told when each phase ends (both end with a host read: the decode loop reads whether every row is done, the
        scoring reads the completions); ``generating`` (fault injection, ``StepContext.generating``) called at the
        generation's first forward."""
        g, tok = self.task.grpo, self.task.tokenizer()
        ids, mask = G.joined_prompts(batches, pad_id(tok))
        if self.task.sync_weights is not None:  # another engine's copy of the weights, brought up to date
            self.task.sync_weights(model)
            lap("weight_sync", synced=True)
        if self.task.environment is not None:
            return self.episodes(model, accelerator, batches, ids, mask, generator, step, lap, generating)
        with accelerator.autocast(), on_first_forward(model, generating):
            rollout = self.task.generate(
                model, ids, mask, num_generations=g.num_generations, sampling=self.task.sampling,
                eos_ids=stop_ids(model, tok), pad_id=pad_id(tok), generator=generator, stop=stop_strings(tok, g.stop))
        lap("generation", synced=True)
        parts = G.split(rollout, [len(b["prompt_input_ids"]) * g.num_generations for b in batches])
        scored = [G.score(b, part, tok, list(self.task.rewards), g.num_generations, step)
                  for b, part in zip(batches, parts)]
        lap("scoring", synced=True)
        return scored

    def episodes(self, model, accelerator, batches: list[dict], ids, mask, generator, step: int, lap,  # noqa: ANN001
                 generating=None) -> list[G.Scored]:  # noqa: ANN001
        """``sample_and_score`` of a multi-turn run: the step's episodes (``episodes.run``: every turn one generation
        of the episodes still going), then each micro-batch's scored (``rollout.score_episodes``)."""
        g, tok = self.task.grpo, self.task.tokenizer()
        with accelerator.autocast(), on_first_forward(model, generating):
            eps = E.run(model, ids, mask, [row for b in batches for row in E.prompt_rows(b)],
                        self.task.episode_settings(model), num_generations=g.num_generations,
                        sampling=self.task.sampling, tokenizer=tok, eos_ids=stop_ids(model, tok), pad_id=pad_id(tok),
                        generator=generator, stop=stop_strings(tok, g.stop), lap=lap)
        parts = G.split_episodes(eps, [len(b["prompt_input_ids"]) * g.num_generations for b in batches])
        scored = [G.score_episodes(b, part, tok, list(self.task.rewards), g.num_generations, step)
                  for b, part in zip(batches, parts)]
        lap("scoring", synced=True)
        return scored

    def loss(self, model, batch: dict) -> tuple:  # noqa: ANN001
        """The loss sum of a training micro-batch and TRL's step metrics: the rollout's (reward, ...), the clipped
        fraction, the KL (beta > 0) and the entropy of the completions (from the logits' log-softmax, or the chunked
        loss's chunk by chunk; none from Liger's kernel, which GRPO never gets); every per-token value is one per
        completion position (``forward``)."""
        g, weights = self.task.grpo, batch["loss_weight"]
        losses, spread = F.completion_losses(self.task, model, batch, entropy=True)
        logps, mask = -losses, completion_mask(batch)
        old = batch.get("old_logps", logps.detach())
        per_token, clipped = L.surrogate(logps, old, batch["advantages"], g.epsilon, g.resolved_epsilon_high())
        metrics = G.rollout_metrics(batch["rollout_values"], batch.get(flat_groups.ROLLOUT_WEIGHTS, weights),
                                    self.task.metric_names)
        sampler = batch.get(G.SAMPLER_LOGPS)
        if sampler is not None:  # how far the sampler was from the trainer, and (on) the correction for it
            metrics.update(L.sampling_metrics(old, sampler, mask, weights))
            if self.task.corrects_sampling:
                per_token = per_token * L.truncated_ratio(old, sampler, g.importance_sampling_cap)
        if g.beta > 0:
            kl = L.kl_k3(logps, batch["ref_logps"])
            per_token = per_token + g.beta * kl
            metrics["kl"] = L.masked_sum(kl.detach(), mask, weights)
        metrics["clip_ratio"] = L.masked_sum(clipped, mask, weights)
        if spread is not None:
            metrics["entropy"] = L.masked_sum(spread, mask, weights)
        return L.reduce(per_token, mask, weights, g.loss), metrics

    def forward_loss(self, model, batch: dict):  # noqa: ANN001, ANN201
        """The loss of a training micro-batch (the memory model's calibration passes; ``loss``'s)."""
        return self.loss(model, batch)[0], None


def completion_mask(batch: dict) -> torch.Tensor:
    """1 on the completion tokens that weigh in the loss (rows, C)."""
    return (batch[F.COMPLETION_LABELS] != G.IGNORE).long()


@dataclasses.dataclass(frozen=True)
class Grpo(CausalLM):
    """GRPO: the run's ``grpo`` section as it is (or as a trained model recorded it, for ``leantrain eval``), its
    reward functions loaded, what follows from the other sections, and what it is bound to (the tokenizer, the frozen
    reference, the policy's precision context)."""

    grpo: GrpoConfig = dataclasses.field(default_factory=GrpoConfig)  # the grpo.* section
    rewards: tuple = ()  # the reward functions of grpo.rewards, loaded (weights applied)
    environment: type | None = None  # grpo.environment's class, loaded
    reference: str = "none"  # beta > 0: "adapter" (LoRA off) or "live" (a frozen copy); else none
    prompt_tokens: int = 0  # the prompts' budget (data.max_prompt_length or block_size // 2)
    processor: object = dataclasses.field(default=None, compare=False, repr=False)  # the run's tokenizer
    frozen_reference: object = dataclasses.field(default=None, compare=False, repr=False)  # live: the frozen copy
    policy_autocast: object = dataclasses.field(default=None, compare=False, repr=False)  # the policy's precision
    parts = dataclasses.replace(CausalLM.parts, data=GrpoData, model=GrpoModel, step=GrpoStep,
                                evaluation=GrpoEvaluation, report=GrpoReport)

    def configured(self, cfg, model_config=None) -> "Grpo":  # noqa: ANN001
        """The run's ``grpo.*``; with a trained model's ``model_config`` (``leantrain eval``), what it recorded
        (rewards, ``max_new_tokens``, ...) for each key not given."""
        rec = (getattr(model_config, RECORD, None) or {}) if model_config is not None else {}
        given = cfg.grpo.model_fields_set | ({"reward_weights"} if "rewards" in cfg.grpo.model_fields_set else set())
        g = cfg.grpo.model_copy(update={k: v for k, v in rec.items() if k not in given})
        weights = g.reward_weights
        return dataclasses.replace(
            self, grpo=g,
            rewards=loaded_rewards(tuple(g.rewards), None if weights is None else tuple(weights)) if g.rewards else (),
            environment=load_environment(g.environment, "grpo.environment") if g.environment else None,
            reference="none" if g.beta == 0 else "adapter" if cfg.peft.method != "none" else "live",
            prompt_tokens=cfg.data.max_prompt_length or cfg.data.block_size // 2)

    def check_config(self, cfg, task: Task) -> None:  # noqa: ANN001 - a Config
        """The ``grpo.*`` keys; with ``grpo.generation=vllm``, that vLLM imports here (exit 2 saying how to install
        it, before any model loads; the model itself is checked with its config: ``GrpoModel.check_architecture``)."""
        owner = isinstance(task, Grpo)
        check_grpo_keys(cfg, task, owner)
        if cfg.grpo.generation == "vllm" and owner:
            vllm_engine.imported()

    @property
    def generate(self):  # noqa: ANN201 - decode.generate's call
        """The engine of ``grpo.generation`` (``backends``), vLLM's sized for the prompt budget + ``max_new_tokens``."""
        return backend(self.grpo.generation, self.vllm_settings)

    @property
    def sync_weights(self):  # noqa: ANN201 - a callable(model) or None
        """What pushes the trained weights into the engine before it generates (vLLM), or None (leantrain's own)."""
        return weight_sync(self.grpo.generation, self.vllm_settings)

    @property
    def vllm_settings(self) -> vllm_engine.VllmSettings:
        g = self.grpo
        return vllm_engine.VllmSettings(g.vllm_memory, self.prompt_tokens + g.episode_tokens())

    @property
    def sampling(self) -> Sampling:
        g = self.grpo
        return Sampling(g.max_new_tokens, g.temperature, g.top_p, g.top_k)

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The names of a training micro-batch's ``rollout_values`` columns (``rollout.metric_names``)."""
        return G.metric_names(list(self.rewards), self.environment is not None)

    def episode_settings(self, model) -> E.Settings:  # noqa: ANN001
        """What an episode runs with (``episodes.Settings``): the environment, its tools as the prompts were rendered
        with them, the tool-call format of the model's template (``env_tokens.tool_format``), the limits."""
        g, tok = self.grpo, self.tokenizer()
        tools = schemas(self.environment) or None
        return E.Settings(self.environment, tools, tool_format(tok), g.tool_timeout, g.max_turns, g.episode_tokens(),
                          frozenset(int(i) for i in stop_ids(model, tok)), g.episode_cache == "keep")

    @property
    def corrects_sampling(self) -> bool:
        """``grpo.importance_sampling``: on, or auto with another engine sampling (vLLM)."""
        mode = self.grpo.importance_sampling
        return mode == "on" or (mode == "auto" and self.grpo.generation == "vllm")

    def tokenizer(self):  # noqa: ANN201 - a tokenizer
        """The model's tokenizer, as the run bound it (``Data.with_processor``)."""
        if self.processor is None:
            raise RuntimeError("GRPO decodes its completions with the run's tokenizer: bind it first "
                               "(task.data.with_processor)")
        return self.processor

    def autocast(self):  # noqa: ANN201 - a context manager
        return self.policy_autocast() if self.policy_autocast is not None else nullcontext()

    def reference_logps(self, model, batch: dict) -> torch.Tensor:  # noqa: ANN001
        """The reference's per-token log-probs of a training micro-batch (``token_logps``): the model with its adapters
        off, or the frozen copy."""
        if self.reference == "live":
            ref, context = self.frozen_reference.to(batch[F.PROMPT_IDS].device), self.autocast()
        else:
            ref = unwrapped(model)
            context = ref.disable_adapter() if hasattr(ref, "disable_adapter") else nullcontext()
        with context, frozen_forward(ref):
            return self.token_logps(ref, batch)

    def token_logps(self, model, batch: dict) -> torch.Tensor:  # noqa: ANN001
        """The per-token log-probs of a training micro-batch's completions (rows, C: ``forward``)."""
        return -F.completion_losses(self, model, batch)[0]


GRPO_TASK = register(Grpo(
    task_spec(GRPO),
    # advantages weigh a row's tokens by its sign: no Liger (efficiency.chunked_loss); tokens/s: prompt + completion
    Traits(labels="prompts", unit="tokens", auto_model="AutoModelForCausalLM", loads_as="text-generation",
           speed_unit="tokens", token_blocks=True, uniform_token_gradients=False, scratch_needs_tokenizer=True,
           progress_keys=("reward", "reward_std", "kl"), default_for=("prompts",),
           forward_paths=(DECODE_STEP, SHARED_PROMPTS)),
    CardText("reinforcement learning (GRPO)", "language model trained with GRPO",
             '"What is 2 + 3?", max_new_tokens=40', "generator")))
