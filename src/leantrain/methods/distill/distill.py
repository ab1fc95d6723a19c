"""Distillation (``model.task=distill``): a student causal LM learns a frozen teacher's next-token distribution on
completions of the data's prompts (``distill.*``, ``config/distill.py``; TRL's GKDTrainer's meanings and names).

One global step, top to bottom (``DistillStep``; the engine calls ``batches`` then ``loss`` per micro-batch):

1. **whose completions**: the student's own samples with probability ``distill.lmbda`` (on-policy distillation),
   else the data's completions (KD; the teacher's own samples with ``distill.seq_kd``): one draw per step from a
   generator seeded by the run's seed alone, so every process makes the same choice, resumed bitwise;
2. **sample** (on-policy, seq_kd): one completion per prompt of every micro-batch of the process in one generation
   (``leantrain.modeling.generation``: no_grad, the run's precision, the process's own seeded generator, as GRPO's);
3. **teacher**: one no-grad forward of the teacher per micro-batch, its output layer's input kept at each completion
   position (``forward``: ``(rows, C, H)``, not ``tokens x vocab``);
4. **loss**: per completion token, the generalised JSD of the student's and the teacher's distributions (``losses``:
   chunk by chunk, each chunk checkpointed), summed over the tokens and divided by the global count of completion
   tokens (the engine's division: the loss is the mean per token whatever the micro-batches and processes).

Evaluation: one greedy completion per eval prompt by the student, then its per-token divergence to the teacher as
trained (``kl``), the reverse and forward KL at temperature 1 on the whole vocabulary, both models' mean log-probs of
those tokens, and with ``grpo.rewards`` the reward of the completions (``eval.reward``). The parts around the step are
in ``parts.py``.
"""

from __future__ import annotations

import dataclasses
import functools
from contextlib import nullcontext

import torch

from leantrain.config.distill import DistillConfig, check_distill_keys
from leantrain.config.tasks import DISTILL, task_spec
from leantrain.methods.distill import forward as D
from leantrain.methods.distill import losses as L
from leantrain.methods.distill.parts import (RECORD, DistillData, DistillEvaluation, DistillModel, DistillReport,
                                             DistillSampler)
from leantrain.methods.grpo import rollout as G
from leantrain.methods.grpo.parts import loaded_rewards, on_first_forward
from leantrain.methods.lm.causal_lm import CausalLM
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.seam import StepBatches
from leantrain.methods.traits import Traits
from leantrain.modeling.chunked_loss import chunked_layer, default_chunk_tokens
from leantrain.modeling.fast_paths import DECODE_STEP
from leantrain.modeling.generation.decode import generate, pad_id, stop_ids
from leantrain.modeling.generation.sampling import Sampling
from leantrain.modeling.generation.stops import stop_strings
from leantrain.modeling.wrappers import frozen_forward

CHUNK_SHARE = 4  # a chunk of the divergence holds ~4 fp32 chunk x vocab tensors per model: a quarter of the loss's rows


class DistillStep(CausalLM.parts.step):
    """whose completions -> sample -> teacher (``batches``), then the divergence of each micro-batch (``loss``)."""

    def state(self, seed: int, rank: int) -> DistillSampler:
        return DistillSampler(seed, rank)

    def batches(self, ctx, micro_batches: list[dict], count) -> StepBatches:  # noqa: ANN001 - a StepContext
        task, d, acc = self.task, self.task.distill, ctx.accelerator
        lap = ctx.lap or (lambda phase, synced=False: None)
        on_policy = ctx.state.on_policy(d.lmbda) if ctx.state is not None else d.lmbda >= 1
        generator = ctx.state.generator(acc.device) if ctx.state is not None else None
        sampler = ctx.model if on_policy else task.teacher_on(acc.device) if task.samples_off_policy else None
        parts: list = [None] * len(micro_batches)
        if sampler is not None:
            with acc.autocast() if on_policy else task.teacher_autocast(), on_first_forward(sampler, ctx.generating):
                parts = task.sample(sampler, micro_batches, generator)
            lap("generation", synced=True)
        tok = pad_id(task.tokenizer())
        made = [D.training_rows(b, part, d.max_new_tokens, tok, on_policy) for b, part in zip(micro_batches, parts)]
        for rows in made:
            task.add_teacher(rows)
        lap("teacher")
        units = torch.stack([D.selected(b).sum() for b in made]).sum()
        tokens = torch.stack([G.tokens(b) for b in made]).sum()  # a device scalar: no host read
        samples = functools.partial(task.samples, micro_batches[0], made[0], on_policy) if made else ()
        return StepBatches(made, units, tokens=tokens, samples=samples)

    def loss(self, model, batch: dict) -> tuple:  # noqa: ANN001
        """The divergence summed over the micro-batch's completion tokens (rows weighted by ``loss_weight``), and the
        step metrics: ``kl`` (the divergence as trained, per token), ``student_logp`` / ``teacher_logp`` (each model's
        mean log-prob of the completion tokens, temperature 1), ``on_policy`` (the share of the student's own
        samples), the completions' mean length and clipped share."""
        keep = D.selected(batch)
        div, student_lp, teacher_lp = (x.view_as(keep) for x in self.task.divergence(model, batch))
        tokens = keep.sum()
        rows = (batch["loss_weight"] != 0).float()
        lengths = batch[D.COMPLETION_MASK].sum(-1).float()
        metrics = {"kl": ((div.detach() * keep).sum(), tokens), "student_logp": ((student_lp * keep).sum(), tokens),
                   "teacher_logp": ((teacher_lp * keep).sum(), tokens),
                   "on_policy": ((batch[D.ON_POLICY] * rows).sum(), rows.sum()),
                   "completions/mean_length": ((lengths * rows).sum(), rows.sum()),
                   "completions/clipped_ratio": (((lengths >= self.task.distill.max_new_tokens).float() * rows).sum(),
                                                 rows.sum())}
        return (div * keep * batch["loss_weight"].unsqueeze(1)).sum(), metrics

    def forward_loss(self, model, batch: dict):  # noqa: ANN001, ANN201
        """The loss of a training micro-batch (the memory model's calibration passes; ``loss``'s)."""
        return self.loss(model, batch)[0], None


@dataclasses.dataclass(frozen=True)
class Distill(CausalLM):
    """Distillation: the run's ``distill`` section (or as a trained model recorded it, for ``leantrain eval``), the
    eval's reward functions (``grpo.rewards``), and what it is bound to (the tokenizer, the teacher and its precision
    context, the student's precision context)."""

    distill: DistillConfig = dataclasses.field(default_factory=DistillConfig)
    rewards: tuple = ()  # grpo.rewards, loaded: scored on the eval's completions only
    prompt_tokens: int = 0  # the prompts' budget (data.max_prompt_length or block_size // 2)
    processor: object = dataclasses.field(default=None, compare=False, repr=False)
    teacher: object = dataclasses.field(default=None, compare=False, repr=False)  # the frozen teacher model
    teacher_precision: object = dataclasses.field(default=None, compare=False, repr=False)  # its autocast
    policy_autocast: object = dataclasses.field(default=None, compare=False, repr=False)
    parts = dataclasses.replace(CausalLM.parts, data=DistillData, model=DistillModel, step=DistillStep,
                                evaluation=DistillEvaluation, report=DistillReport)
    GRPO_KEYS_READ = ("rewards", "reward_weights")  # the grpo.* keys it reads (its eval's rewards)

    def configured(self, cfg, model_config=None) -> "Distill":  # noqa: ANN001
        """The run's ``distill.*``; with a trained model's ``model_config`` (``leantrain eval``), what it recorded
        (the teacher, beta, ...) for each key not given."""
        rec = (getattr(model_config, RECORD, None) or {}) if model_config is not None else {}
        given = cfg.distill.model_fields_set
        known = type(cfg.distill).model_fields
        d = cfg.distill.model_copy(update={k: v for k, v in rec.items() if k not in given and k in known})
        g = cfg.grpo
        weights = None if g.reward_weights is None else tuple(g.reward_weights)
        rewards = loaded_rewards(tuple(g.rewards), weights) if g.rewards else ()
        return dataclasses.replace(self, distill=d, rewards=rewards,
                                   prompt_tokens=cfg.data.max_prompt_length or cfg.data.block_size // 2)

    def check_config(self, cfg, task: Task) -> None:  # noqa: ANN001 - a Config
        check_distill_keys(cfg, task, owner=isinstance(task, Distill))

    @property
    def samples_off_policy(self) -> bool:
        """Off-policy steps sample from the teacher (``distill.seq_kd``) instead of reading the data's completions."""
        return self.distill.seq_kd

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.distill.max_new_tokens, self.distill.temperature, 1.0, 0)

    def tokenizer(self):  # noqa: ANN201 - a tokenizer
        if self.processor is None:
            raise RuntimeError("distillation decodes its completions with the run's tokenizer: bind it first "
                               "(task.data.with_processor)")
        return self.processor

    def autocast(self):  # noqa: ANN201 - a context manager
        return self.policy_autocast() if self.policy_autocast is not None else nullcontext()

    def teacher_autocast(self):  # noqa: ANN201 - a context manager
        return self.teacher_precision() if self.teacher_precision is not None else nullcontext()

    def teacher_on(self, device: torch.device):  # noqa: ANN201 - a model
        if self.teacher is None:
            raise RuntimeError("distillation needs its teacher: bind the method to the model first (task.model.bind)")
        return self.teacher.to(device)

    def sample(self, model, batches: list[dict], generator, greedy: bool = False) -> list:  # noqa: ANN001
        """One completion per prompt of ``batches`` (micro-batches) in one generation by ``model``, cut back into one
        rollout per micro-batch."""
        tok = self.tokenizer()
        ids, mask = G.joined_prompts(batches, pad_id(tok))
        sampling = dataclasses.replace(self.sampling, temperature=0.0) if greedy else self.sampling
        rollout = generate(model, ids, mask, num_generations=1, sampling=sampling, eos_ids=stop_ids(model, tok),
                           pad_id=pad_id(tok), generator=generator, stop=stop_strings(tok, self.distill.stop))
        return G.split(rollout, [len(b["prompt_input_ids"]) for b in batches])

    def add_teacher(self, rows: dict) -> None:
        """The teacher's outputs at the completion positions of training ``rows`` (no grad, its precision): its output
        layer's input (``forward.TEACHER_STATES``), or its logits where it has no capturable output layer."""
        teacher = self.teacher_on(rows[D.PROMPT_IDS].device)
        with self.teacher_autocast(), frozen_forward(teacher):
            states, logits, _ = D.completion_outputs(teacher, rows)
        rows[D.TEACHER_STATES if states is not None else D.TEACHER_LOGITS] = states if states is not None else logits

    def divergence(self, model, batch: dict, beta: float | None = None, temperature: float | None = None,  # noqa: ANN001
                   top_k: int | None = None):  # noqa: ANN201
        """(divergence, student log-prob, teacher log-prob) at each completion position of ``batch`` (``rows * C``,
        padding included: the caller weighs them), as trained (``distill.beta`` / ``temperature`` / ``teacher_top_k``)
        unless given."""
        d = self.distill
        student, teacher, chunk = self.pair(model, batch)
        return L.chunked_divergence(student, teacher, batch[D.COMPLETION_IDS].reshape(-1),
                                    d.beta if beta is None else beta,
                                    d.temperature if temperature is None else temperature,
                                    d.teacher_top_k if top_k is None else top_k, chunk)

    def pair(self, model, batch: dict) -> tuple[L.Logits, L.Logits, int]:  # noqa: ANN001
        """(the student's outputs, the teacher's, the rows a chunk) at each completion position of ``batch``: the
        student's forward here, the teacher's states (or logits) as ``add_teacher`` kept them."""
        student = D.as_logits(*D.completion_outputs(model, batch))
        if D.TEACHER_STATES in batch:
            out, states = chunked_layer(self.teacher), batch[D.TEACHER_STATES]
            teacher = L.Logits(states=states.reshape(-1, states.shape[-1]), weight=out.weight,
                               bias=getattr(out, "bias", None), dtype=states.dtype)
        else:
            teacher = D.as_logits(None, batch[D.TEACHER_LOGITS], None)
        device = batch[D.COMPLETION_IDS].device.type
        chunk = max(1, default_chunk_tokens(min(student.width, teacher.width), device) // CHUNK_SHARE)
        return student, teacher, chunk

    def samples(self, batch: dict, rows: dict, on_policy: bool) -> list[dict]:
        """The first ``distill.log_completions`` completions of real prompts as ``completions.jsonl`` records."""
        mask = rows[D.COMPLETION_MASK]
        live = torch.nonzero(rows["loss_weight"] != 0).flatten().tolist()[:self.distill.log_completions]
        tok = self.tokenizer()
        source = "student" if on_policy else "teacher" if self.samples_off_policy else "data"
        return [{"prompt": batch["prompt"][i], "source": source,
                 "completion": tok.decode(rows[D.COMPLETION_IDS][i][:int(mask[i].sum())], skip_special_tokens=True)}
                for i in live]


DISTILL_TASK = register(Distill(
    task_spec(DISTILL),
    # the divergence weighs each vocabulary entry: no Liger (efficiency.chunked_loss); tokens/s: prompt + completion
    Traits(labels="prompts", unit="tokens", auto_model="AutoModelForCausalLM", loads_as="text-generation",
           speed_unit="tokens", token_blocks=True, uniform_token_gradients=False, scratch_needs_tokenizer=True,
           progress_keys=("loss", "student_logp", "teacher_logp"), forward_paths=(DECODE_STEP,)),
    CardText("distillation from a teacher model", "language model distilled from a teacher",
             '"What is 2 + 3?", max_new_tokens=40', "generator")))
