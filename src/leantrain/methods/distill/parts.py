"""Distillation's parts around its step (``distill.py``): its resumable sampler (the process's sampling generator and
the step's on- or off-policy draw), its data (prompts, with or without completions), its model (the teacher checked
before any weight loads, then loaded frozen in the run's precision), its evaluation (the student's greedy completions,
their divergence to the teacher, their reward) and its report (what the saved model records, the card, the plan)."""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
import torch

from leantrain.config import ModelConfig
from leantrain.errors import ConfigError, DataError, UserError
from leantrain.methods.distill import forward as D
from leantrain.methods.distill import losses as L
from leantrain.methods.grpo import rewards as R
from leantrain.methods.grpo import rollout as G
from leantrain.methods.grpo.parts import GrpoModel, Sampler
from leantrain.methods.lm.causal_lm import CausalLM
from leantrain.modeling import model_name
from leantrain.modeling.chunked_loss import install_chunked_loss
from leantrain.modeling.generation.decode import pad_id
from leantrain.modeling.load import load_config, load_tokenizer, load_trained_model
from leantrain.modeling.wrappers import unwrapped

log = logging.getLogger("leantrain")

RECORD = "distill"  # config.json's field: the teacher and the settings the student was distilled with
TEACHER_SAMPLES, DATA_COMPLETIONS = "the teacher's samples", "the data's completions"  # off-policy steps' rows
RECORDED = ("teacher", "lmbda", "beta", "temperature", "max_new_tokens", "teacher_top_k", "seq_kd", "stop")


class DistillSampler(Sampler):
    """GRPO's sampler (the process's sampling generator, seeded by the seed and the rank) and the step's draw of whose
    completions it trains on, from a CPU generator seeded by the run's seed alone: every process draws the same."""

    def __init__(self, seed: int, rank: int):
        super().__init__(seed, rank)
        self.draws = torch.Generator().manual_seed(int(seed))

    def on_policy(self, lmbda: float) -> bool:
        """Whether this step trains on the student's own samples (probability ``lmbda``; one draw every step)."""
        return bool(torch.rand((), generator=self.draws).item() < lmbda)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "draws": self.draws.get_state()}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "draws" in state:
            self.draws.set_state(state["draws"])


def teacher_config(name: str) -> ModelConfig:
    """The model settings the teacher loads with (its own name, safetensors only, no remote code)."""
    return ModelConfig(name=name)


def check_teacher(cfg, where: str) -> None:  # noqa: ANN001 - a leantrain Config
    """Exit 2 before any weight loads: a teacher whose config does not load, that is no decoder, or whose tokenizer
    is not the student's (``where``: how the student is named)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # lazy: heavy

    name = cfg.distill.teacher
    tcfg = teacher_config(name)
    try:
        config = load_config(tcfg)
        teacher_tok = load_tokenizer(tcfg, say=False)
    except (UserError, ConfigError) as e:
        why = str(e).removeprefix(f"model.name={name}: ")
        raise ConfigError(f"distill.teacher={name}: the teacher does not load ({why})") from None
    if getattr(config, "model_type", None) not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ConfigError(f"distill.teacher={name}: model type {getattr(config, 'model_type', None)} is not a causal "
                          "language model; the teacher scores the student's next tokens")
    student_tok = load_tokenizer(cfg.model, say=False)
    if teacher_tok.get_vocab() != student_tok.get_vocab():
        s, t = student_tok.get_vocab(), teacher_tok.get_vocab()
        differ = sorted(set(s.items()) ^ set(t.items()), key=lambda kv: kv[1])[:3]
        raise ConfigError(
            f"distill.teacher={name}: its tokenizer ({len(t)} tokens) is not the student's ({where}, {len(s)} tokens; "
            f"e.g. {', '.join(f'{k!r}={v}' for k, v in differ)} differ): the divergence compares the two models' "
            "probabilities token id by token id, so they must share the vocabulary; cross-tokenizer distillation is "
            "not supported (docs/not-yet.md)")


class DistillData(CausalLM.parts.data):
    def side(self):  # noqa: ANN201 - a Modality
        """The prompts' side, reading a ``completion`` beside each prompt too (or ``messages`` conversations)."""
        side = super().side()
        return dataclasses.replace(
            side, load_and_validate=lambda cfg, **kw: side.load_and_validate(cfg, answers=True, **kw),
            load_rows=lambda path, cfg, **kw: side.load_rows(path, cfg, answers=True, **kw))

    def check(self, columns: dict, cfg=None) -> None:  # noqa: ANN001 - a Config
        """Off-policy steps need the data's completions (or the teacher's: seq_kd); the eval's reward functions get
        their dry call on the first rows."""
        if cfg is None:
            return
        d = self.task.distill
        if d.lmbda < 1 and not d.seq_kd and columns.get("format") == "prompts" and not columns.get("answered"):
            raise DataError(f"distill.lmbda={d.lmbda:g}: off-policy steps train on the data's completions, and "
                            f"data.train={cfg.data.train} has prompts only (no 'completion' column, no 'messages' "
                            "ending with the assistant's turn); set distill.lmbda=1 (on-policy only) or "
                            "distill.seq_kd=true (the teacher writes them)")
        rows = columns.get("first_rows")
        if self.task.rewards and rows:
            R.check_rewards(list(self.task.rewards), rows, conversational=columns.get("prompt") == "messages")

    def generated_tokens(self) -> tuple[int, str]:
        return self.task.distill.max_new_tokens, "distill.max_new_tokens"

    def with_processor(self, processor):  # noqa: ANN001, ANN201
        return dataclasses.replace(self.task, processor=processor)

    def count(self, dataset, indices) -> int:  # noqa: ANN001
        """Prompts in these rows (the loss's own count, completion tokens, is made with its batches)."""
        return int((np.asarray(indices) >= 0).sum())


class DistillModel(CausalLM.parts.model):
    def check_architecture(self, cfg, config) -> None:  # noqa: ANN001 - a leantrain Config, a transformers config
        """A causal LM's checks, then the teacher's (``check_teacher``)."""
        super().check_architecture(cfg, config)
        where = f"model.name={cfg.model.name}" if cfg.model.name else f"model.tokenizer={cfg.model.tokenizer}"
        check_teacher(cfg, where)

    def bind(self, model, autocast=None):  # noqa: ANN001, ANN201 - a Distill
        """Bound to the model as it starts: the teacher loaded (once) frozen in the dtype the student's forward
        computes in (its autocast's, else fp32), its output layer captured (no logits), run under the same
        ``autocast``."""
        task = self.task
        teacher = task.teacher
        if teacher is None:
            dtype = compute_dtype(model, autocast)
            teacher = load_trained_model(model_name(teacher_config(task.distill.teacher)), task,
                                         teacher_config(task.distill.teacher)).to(dtype)
            log.info("teacher: %s, frozen, %s", task.distill.teacher, str(dtype).removeprefix("torch."))
        return task.evaluation.with_reference(teacher, autocast)

    def merge_check_value(self, model, batch: dict):  # noqa: ANN001, ANN201
        """The model's summed loss on the prompts themselves (GRPO's: a batch of prompts has nothing else)."""
        return GrpoModel.merge_check_value(self, model, batch)

    def calibration_batch(self, batch: dict) -> dict:
        """The memory model's m synthetic rows as a training micro-batch of m prompts, each cut at the prompt budget and
        followed by ``max_new_tokens`` of its tokens as its completion, with the teacher's states (zeros)."""
        d, ids = self.task.distill, batch["input_ids"]
        width = min(ids.shape[1], self.task.prompt_tokens + d.max_new_tokens)
        span = min(d.max_new_tokens, width - 1)
        prompts, completions = ids[:, :width - span], ids[:, width - span:width]
        teacher = self.task.teacher
        hidden = teacher.config.hidden_size if teacher is not None else 1
        n = ids.shape[0]
        out = {D.PROMPT_IDS: prompts, D.PROMPT_MASK: torch.ones_like(prompts), D.COMPLETION_IDS: completions,
               D.COMPLETION_MASK: torch.ones_like(completions), D.COMPLETION_LABELS: completions,
               "loss_weight": ids.new_ones(n, dtype=torch.float32), D.ON_POLICY: ids.new_ones(n, dtype=torch.float32)}
        dtype = next(teacher.parameters()).dtype if teacher is not None else torch.float32
        out[D.TEACHER_STATES] = torch.zeros(n, span, hidden, dtype=dtype, device=ids.device)
        return out


def compute_dtype(model, autocast) -> torch.dtype:  # noqa: ANN001 - a model, a callable or None
    """The dtype ``model``'s forward computes in under ``autocast()``: its autocast dtype, else fp32."""
    device = next(unwrapped(model).parameters()).device.type
    if autocast is None:
        return torch.float32
    with autocast():
        return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32


EVAL_VALUES = ("kl", "reverse_kl", "forward_kl", "student_logp", "teacher_logp", "tokens")


class DistillEvaluation(CausalLM.parts.evaluation):
    def with_reference(self, model, autocast=None):  # noqa: ANN001, ANN201 - a Distill
        """This method with ``model`` as its teacher, frozen, in eval mode, its output layer captured (no logits)
        where it can be, run under ``autocast()``."""
        model.eval().requires_grad_(False)
        install_chunked_loss(model)
        return dataclasses.replace(self.task, teacher=model, teacher_precision=autocast, policy_autocast=autocast)

    def reference_model_name(self) -> str | None:
        """``leantrain eval``: the recorded teacher."""
        return self.task.distill.teacher

    def check_evaluable(self) -> None:
        if not self.task.distill.teacher:
            raise UserError("this model records no distillation teacher (distill.teacher): set distill.teacher=<the "
                            "teacher> to evaluate it against one")

    def outputs(self, model, batch: dict) -> tuple:  # noqa: ANN001
        """Per prompt, from its greedy completion by the student: the sums over its tokens of the divergence as trained,
        the reverse and forward KL (temperature 1, whole vocabulary), both models' log-probs, the token count; then its
        reward and each function's score (NaN: none, or no ``grpo.rewards``) (fp64)."""
        task = self.task
        with task.autocast():
            [rollout] = task.sample(model, [batch], None, greedy=True)
        rows = D.training_rows(batch, rollout, task.distill.max_new_tokens, pad_id(task.tokenizer()), True)
        task.add_teacher(rows)
        keep = D.selected(rows).double()
        with task.autocast():
            student, teacher, chunk = task.pair(model, rows)
            targets = rows[D.COMPLETION_IDS].reshape(-1)
            d = task.distill
            kl, s_lp, t_lp = L.chunked_divergence(student, teacher, targets, d.beta, d.temperature, d.teacher_top_k,
                                                  chunk)
            reverse = L.chunked_divergence(student, teacher, targets, 1.0, 1.0, 0, chunk)[0]
            forward = L.chunked_divergence(student, teacher, targets, 0.0, 1.0, 0, chunk)[0]
        per_token = torch.stack([kl, reverse, forward, s_lp, t_lp, torch.ones_like(kl)], dim=1).double()
        n = keep.shape[0]
        sums = (per_token.view(n, -1, len(EVAL_VALUES)) * keep.unsqueeze(-1)).sum(1)
        scores = torch.full((n, 1 + len(task.rewards)), math.nan, dtype=torch.float64)
        if task.rewards:
            s = G.score(batch, rollout, task.tokenizer(), list(task.rewards), 1, step="in evaluation")
            scores = torch.cat([s.rewards[:, None], torch.from_numpy(s.scores)], dim=1)
        return (torch.cat([sums, scores.to(sums.device)], dim=1),)

    def batch(self, values: torch.Tensor) -> dict:
        out = {k: values[:, i] for i, k in enumerate(EVAL_VALUES)}
        out["reward"] = values[:, len(EVAL_VALUES)]
        out.update({f"rewards/{r.name}": values[:, len(EVAL_VALUES) + 1 + j] for j, r in enumerate(self.task.rewards)})
        return out

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        tokens = float(values["tokens"].sum()) if len(values.get("tokens", ())) else 0.0
        out = {k: float(values[k].sum() / tokens) if tokens else math.nan for k in EVAL_VALUES[:-1]}
        out.update(samples=int(len(values.get("tokens", ()))), tokens=int(tokens))
        if self.task.rewards:
            out.update({k: float(np.nanmean(v)) if len(v) and not np.isnan(v).all() else math.nan
                        for k, v in values.items() if k == "reward" or k.startswith("rewards/")})
        return out

    def headline(self, ev: dict) -> str:
        reward = f"  reward: {ev['reward']:.4f}" if "reward" in ev else ""
        return (f"eval KL to the teacher: {ev.get('kl', math.nan):.4f} per token "
                f"(reverse {ev.get('reverse_kl', math.nan):.4f}, "
                f"forward {ev.get('forward_kl', math.nan):.4f}){reward} ({ev.get('samples', 0)} prompts, greedy)")


class DistillReport(CausalLM.parts.report):
    def summary(self, label_names: list[str]) -> dict:
        d = self.task.distill
        return {"distillation": {k: getattr(d, k) for k in RECORDED}}

    def saved_config(self, ev: dict | None) -> dict:
        return {RECORD: {k: getattr(self.task.distill, k) for k in RECORDED}}

    def card_notes(self, model_config: dict) -> list[str]:
        rec = model_config.get(RECORD) or {}
        if not rec:
            return []
        kind = {0.0: "forward KL (teacher || student)", 1.0: "reverse KL (student || teacher)"}.get(
            float(rec.get("beta", 1.0)), f"generalised JSD, beta {rec.get('beta')}")
        share = float(rec.get("lmbda", 1.0))
        return ["## Distillation", "", f"Teacher: {rec.get('teacher')}. Loss: {kind} per completion token at "
                f"temperature {rec.get('temperature')}; {share:.0%} of the steps on the student's own samples of at "
                f"most {rec.get('max_new_tokens')} tokens, the rest on "
                f"{TEACHER_SAMPLES if rec.get('seq_kd') else DATA_COMPLETIONS}"
                + (f"; the teacher's top {rec.get('teacher_top_k')} tokens and the tail" if rec.get("teacher_top_k")
                   else "") + ".", ""]

    def card_rows(self, summary: dict, config: dict) -> list[tuple[str, object]]:
        data, ev = config.get("data") or {}, summary.get("eval") or {}
        rows = [("prompts", data.get("train")), ("eval prompts", data.get("eval")),
                ("final eval reverse KL to the teacher", ev.get("reverse_kl")), ("final eval reward", ev.get("reward"))]
        return [(k, v) for k, v in rows if v is not None]

    def plan(self, model, per_process: int, precision: str) -> dict:  # noqa: ANN001
        """What the teacher holds beside the student (``leantrain plan``): its weights in the run's compute precision
        (bf16 / fp16, else fp32), its captured states of the step's completions, and the KV cache of the student's
        generation (one completion per prompt of at most ``max_new_tokens``)."""
        c, d = unwrapped(model).config, self.task.distill
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
        element = torch.empty((), dtype=dtype).element_size()
        config = load_config(teacher_config(d.teacher)) if d.teacher else c
        params = self.task.teacher.num_parameters() if self.task.teacher is not None else teacher_parameters(config)
        heads = getattr(c, "num_attention_heads", 1)
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        kv = (getattr(c, "num_key_value_heads", None) or heads) * head_dim
        positions = self.task.prompt_tokens + d.max_new_tokens
        return {"distill_teacher": {
            "teacher": d.teacher, "parameters": params, "weights_bytes": params * element,
            "states_bytes": per_process * d.max_new_tokens * config.hidden_size * element,
            "kv_cache_bytes": per_process * positions * 2 * c.num_hidden_layers * kv * element}}


def teacher_parameters(config) -> int:  # noqa: ANN001 - a transformers config
    """The teacher's parameter count from its config alone (a model on the meta device)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config).num_parameters()
