"""Preference tuning of a causal LM (``model.task=preference``): the DPO family (DPO, IPO, SimPO, ORPO) on
chosen/rejected pairs, and what every preference method shares (``preference.*``; the losses:
``losses``). KTO, on unpaired feedback, is its own method (``kto``); ``configured`` picks it for
``preference.loss=kto``, ``data.for_data`` for ``auto`` on feedback (``METHODS``: the loss that selects each class).

Batches (the ``pairs`` data side): ``input_ids`` / ``attention_mask`` / ``labels`` ``(2B, T)``, rows 0..B-1 the
chosen, rows B..2B-1 the rejected, labels -100 on the prompt and padding; ``ref_logps (B, 2)`` when the reference
log-probs were precomputed. Both halves go through one forward, and the per-token log-probs come from the chunked
output layer (``CausalLM.token_losses``): no ``tokens x vocab`` fp32 logits.

The unit is the pair: ``step.loss_sum`` is the sum of the per-pair losses, the engine divides by the global batch's
pairs, so the loss is the mean over the pairs of the global batch whatever the layout.

The reference (``preference.reference``, resolved in ``configured``): ``adapter``, the same model with its LoRA
adapters switched off (peft's ``disable_adapter``), no copy; ``precompute``, the log-probs read from the batch
(computed once before training by the engine, ``data.precomputed_columns``); ``live``, a frozen copy made by
``model.bind`` before training; ``none``, no reference (simpo, orpo). The reference runs in eval mode under
``torch.no_grad``: it draws no random numbers, so a resumed run is bitwise the same; and in the policy's precision
(the adapter's forward is the policy's, precompute's pass runs under the Accelerator's autocast, the live copy under
the autocast ``model.bind`` was given), so the three give the same log-probs.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from contextlib import nullcontext

import numpy as np
import torch

from leantrain.config.preference import REFERENCE_FREE, check_method_keys
from leantrain.config.tasks import PREFERENCE, task_spec
from leantrain.errors import ConfigError, UserError
from leantrain.methods.preference import losses as L
from leantrain.methods.lm.causal_lm import CausalLM
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.traits import Traits
from leantrain.modeling.wrappers import frozen_forward, unwrapped

MODEL_KEYS = ("input_ids", "attention_mask", "position_ids")
INPUT_COLUMNS = ("chosen_input_ids", "rejected_input_ids")  # a pair's two sequences
REF_COLUMNS = ("ref_chosen_logps", "ref_rejected_logps")  # pairs
PAIR_VALUES = ("loss", "chosen_reward", "rejected_reward", "chosen_logps", "rejected_logps")
RECORD = "preference"  # model/leantrain.json's and config.json's field: the loss settings, the reference
# Every setting that changes the loss, recorded with the model and read back by ``leantrain eval`` (one list: a new
# setting added here is saved and used by eval alike)
LOSS_SETTINGS = ("loss", "beta", "gamma", "label_smoothing", "desirable_weight", "undesirable_weight")


def check_preference_keys(cfg, task: Task) -> None:  # noqa: ANN001 - a Config
    """preference.* keys are for preference tuning and reward models (chosen / rejected data) only. A key counts as
    given when its value is not the default (the workers read the resolved config, every key written out)."""
    given = cfg.preference.changed_keys()
    if given and not task.traits.paired:
        raise ConfigError(f"preference.{given[0]}: for preference tuning and reward models only; this run's task is "
                          f"{task.name} (chosen / rejected or prompt / completion / label data make model.task=auto "
                          "choose preference, or reward-model on a sequence classifier)")


def check_unread_keys(cfg, method: str) -> None:  # noqa: ANN001 - a Config
    """The preference.* and data.* keys ``method`` (a loss, or reward-model) does not read: exit 2 naming the key
    (``config.preference.check_method_keys``; at config time when the config names the method, here once the data
    does)."""
    try:
        check_method_keys(cfg.preference, cfg.data, method)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def data_format(columns: dict) -> str | None:
    """The preference format the data side detected: the training data's, else (``leantrain eval``) the eval data's."""
    return columns.get("format", columns.get("eval_format"))


def local_or_hub(name: str | None) -> str | None:
    """A model folder as an absolute path (``leantrain eval`` may run elsewhere), else the name as given."""
    return str(Path(name).resolve()) if name and Path(name).exists() else name


def pair_weights(batch: dict, losses: torch.Tensor) -> torch.Tensor:
    """Each pair's (KTO: row's) weight in the loss: its ``loss_weight`` (0 for padding pairs), else 1."""
    weight = batch.get("loss_weight")
    return torch.ones_like(losses) if weight is None else weight[: losses.shape[0]].to(losses)


def lm_batch(batch: dict) -> dict:
    """The columns of a preference batch the causal LM's forward reads (not ``ref_logps``, ``desirable``)."""
    return {k: batch[k] for k in (*MODEL_KEYS, "labels") if k in batch}


class PreferenceData(CausalLM.parts.data):
    def for_data(self, columns: dict) -> "Preference":
        """auto: kto on unpaired feedback (``data_format``), else dpo; a pair loss as it is."""
        if self.task.loss != "auto":
            return self.task
        return self.task.as_method("kto" if data_format(columns) == "feedback" else "dpo")

    def check(self, columns: dict, cfg=None) -> None:  # noqa: ANN001 - a Config
        """The data's format against the method (``check_format``); with the run's ``cfg``, the keys the method the
        data selects does not read."""
        self.task.check_format(columns)
        if cfg is not None:
            check_unread_keys(cfg, self.task.method(columns))

    def precomputed_columns(self, columns: list[str]) -> tuple[str, ...]:
        """The per-row columns the engine computes once before training with ``precompute`` (reference=precompute):
        the method's (pairs: chosen, rejected; KTO: row, KL row)."""
        return self.task.ref_columns if self.task.reference == "precompute" else ()

    def precompute(self, model, batch: dict) -> torch.Tensor:
        return self.task.reference_logps(model, batch)

    def count(self, dataset, indices) -> int:
        """Pairs (KTO: feedback rows) in these rows; padding indices (negative) hold none."""
        return int((np.asarray(indices) >= 0).sum())

    def throughput_tokens(self, dataset, indices) -> int | None:
        """tokens/s counts every non-padding token of both sequences of a pair (KTO: a row and its KL row)."""
        indices = np.asarray(indices, dtype=np.int64)
        return int(self.counts.lengths(dataset, self.task.input_columns)[indices[indices >= 0]].sum())


class PreferenceReport(CausalLM.parts.report):
    def saved_config(self, ev: dict | None) -> dict:
        loss = self.task.loss if self.task.loss != "auto" else "dpo"  # auto is resolved by for_data before training
        t = self.task
        return {RECORD: {**{k: getattr(t, k) for k in LOSS_SETTINGS}, "loss": loss, "reference": t.reference,
                         "reference_model": t.reference_name}}

    def card_notes(self, model_config: dict) -> list[str]:
        rec = model_config.get(RECORD) or {}
        if not rec:
            return []
        ref = "none (reference-free)" if rec.get("reference") == "none" else \
            f"{rec.get('reference_model')} ({rec.get('reference')})"
        extra = "".join(f", {k.replace('_', ' ')} {rec[k]}" for k in LOSS_SETTINGS[3:] if k in rec
                        and rec[k] != getattr(type(self.task), k) and (k == "label_smoothing") != (rec["loss"] == "kto"))
        return ["## Preference tuning", "",
                f"Method: {rec.get('loss')}, beta {rec.get('beta')}{extra}; reference: {ref}.", ""]

    def plan(self, model, per_process: int, precision: str) -> dict:  # noqa: ANN001
        """Each reference choice with what it costs beside the policy: memory (a frozen copy's weights) and time."""
        inner = unwrapped(model)
        copy_bytes = sum(p.numel() * p.element_size() for n, p in inner.named_parameters() if "lora_" not in n)
        lora = hasattr(inner, "peft_config")
        options = {
            "adapter": {"extra_bytes": 0, "fits_this_run": lora,
                        "cost": "the same model with its LoRA adapters off: one no-grad forward per step, no copy"},
            "precompute": {"extra_bytes": 0, "fits_this_run": True,
                           "cost": "one no-grad pass over the data before training (cached on disk, 8 bytes a "
                                   "pair), none during training"},
            "live": {"extra_bytes": copy_bytes, "fits_this_run": True,
                     "cost": "a frozen copy of the weights in memory and one no-grad forward per step"},
            "none": {"extra_bytes": 0, "fits_this_run": self.task.loss in REFERENCE_FREE,
                     "cost": "no reference: the reference-free losses (simpo, orpo) only"},
        }
        return {"reference_choices": {"loss": self.task.loss, "reference": self.task.reference, "reference_options": options}}

    def card_rows(self, summary: dict, config: dict) -> list[tuple[str, object]]:
        data, ev = config.get("data") or {}, summary.get("eval") or {}
        rows = [("preference data", data.get("train")), ("eval data", data.get("eval")),
                ("final eval reward accuracy", ev.get("reward_accuracy")),
                ("final eval reward margin", ev.get("reward_margin"))]
        return [(k, v) for k, v in rows if v is not None]


class PreferenceModel(CausalLM.parts.model):
    def bind(self, model, autocast=None) -> "Preference":
        """live: a frozen copy of the model as it starts training (before any resume restores trained weights), run
        under ``autocast()`` as the policy's forward is (Accelerate wraps the policy's forward, not the copy's)."""
        if self.task.reference == "live" and self.task.frozen_reference is None:
            return self.task.evaluation.with_reference(copy.deepcopy(unwrapped(model)), autocast)
        return self.task

    def calibration_batch(self, batch: dict) -> dict:
        """The memory model's m synthetic rows as m pairs; with ``precompute`` carrying reference log-probs as the
        training batches do (no reference forward in the step). ``adapter`` and ``live`` (bound by ``model.bind``)
        run their reference's no-grad forward in ``step.forward_loss``, as in training."""
        pairs = L.as_pairs(batch)
        if self.task.reference != "precompute":
            return pairs
        return {**pairs, "ref_logps": torch.zeros(pairs["loss_weight"].shape[0], 2, device=batch["input_ids"].device)}

    def merge_check_value(self, model, batch: dict):
        """The policy's own summed log-probs, negated: its loss compares with the adapters switched off, which after
        a merge is the merged model itself (a loss of log 2 whatever was learnt)."""
        pairs = L.as_pairs(batch)
        logps, _ = L.sequence_logps(self.task.token_losses(model, lm_batch(pairs)), pairs["labels"])
        return -logps.sum()


class PreferenceEvaluation(CausalLM.parts.evaluation):
    def with_reference(self, model, autocast=None) -> "Preference":
        """This task with ``model`` as its reference (live), frozen, in eval mode, its forward under ``autocast()``
        (the policy's precision context; None: whatever context the caller runs in)."""
        model.eval().requires_grad_(False)
        return dataclasses.replace(self.task, reference="live", frozen_reference=model, policy_autocast=autocast)

    def reference_model_name(self) -> str | None:
        """``leantrain eval``: the recorded reference model (none for the reference-free losses)."""
        return None if self.task.loss in REFERENCE_FREE else self.task.reference_name

    def check_evaluable(self) -> None:
        """A loss that compares with a reference needs the recorded one: a policy tuned from ``model.config`` was
        compared with the random weights it started from, which were never saved."""
        if self.task.loss not in REFERENCE_FREE and not self.task.reference_name:
            raise UserError(f"this model was tuned with preference.loss={self.task.loss} against the model it started from, "
                            "built from model.config with random weights that were not saved: its rewards cannot be "
                            "computed again, so leantrain eval cannot evaluate it (the run's own evaluation is in its "
                            "summary.json and metrics.jsonl). To evaluate with leantrain eval, tune a saved model "
                            "(model.name=<folder>) or use a reference-free loss (preference.loss=simpo or orpo)")

    def outputs(self, model, batch: dict) -> tuple:
        """Per pair: its loss, chosen and rejected rewards, chosen and rejected log-probs (fp64)."""
        _, values = self.task.pair_values(model, batch)
        return (torch.stack([values[k] for k in PAIR_VALUES], dim=-1).double(),)

    def batch(self, values: torch.Tensor) -> dict:
        return {k: values[:, i] for i, k in enumerate(PAIR_VALUES)}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        n = len(values["loss"])
        if not n:
            return {"loss": math.nan, "samples": 0}
        out = {"loss": float(values["loss"].mean()), "samples": int(n)}
        margin = values["chosen_reward"] - values["rejected_reward"]
        out.update(reward_accuracy=float((margin > 0).mean()), reward_margin=float(margin.mean()),
                   **{k: float(values[k].mean()) for k in ("chosen_reward", "rejected_reward", "chosen_logps",
                                                           "rejected_logps")})
        return out

    def headline(self, ev: dict) -> str:
        """The pairs' reward accuracy, margin, loss; a KTO run's evaluation (``leantrain train`` prints the headline
        of the task as registered) has no reward accuracy: its loss and margin."""
        if "reward_accuracy" not in ev:
            return f"eval loss: {ev.get('loss', math.nan):.4f}  reward margin: {ev.get('reward_margin', math.nan):.4f}"
        return (f"eval reward accuracy: {ev['reward_accuracy']:.4f}  reward margin: {ev['reward_margin']:.4f}  "
                f"loss: {ev['loss']:.4f} ({ev.get('samples', 0)} pairs)")


class PreferenceStep(CausalLM.parts.step):
    def forward_loss(self, model, batch: dict):
        losses, values = self.task.pair_values(model, L.as_pairs(batch))
        return (losses * pair_weights(batch, losses)).sum(), values

    def loss(self, model, batch: dict) -> tuple:
        """The loss sum and TRL's training metrics of the pairs (their means over the logging window)."""
        losses, values = self.task.pair_values(model, L.as_pairs(batch))
        weight = pair_weights(batch, losses)
        return (losses * weight).sum(), self.task.step_metrics(values, weight)


@dataclasses.dataclass(frozen=True)
class Preference(CausalLM):
    """Pairs -> one loss each, summed; the count of pairs. The base of every preference method (``METHODS``):
    the settings, the reference, what is recorded with the model."""

    loss: str = "dpo"
    beta: float = 0.1
    gamma: float = 0.5
    label_smoothing: float = 0.0
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    reference: str = "precompute"
    reference_name: str | None = None  # what the reference is (the base model's name), recorded with the model
    frozen_reference: object = dataclasses.field(default=None, compare=False, repr=False)  # live: the frozen copy
    policy_autocast: object = dataclasses.field(default=None, compare=False, repr=False)  # the policy's precision

    parts = dataclasses.replace(CausalLM.parts, data=PreferenceData, report=PreferenceReport, model=PreferenceModel,
                                evaluation=PreferenceEvaluation, step=PreferenceStep)

    def as_method(self, loss: str) -> "Preference":
        """These settings as the method of ``loss`` (``METHODS``: kto's class for kto, this family's otherwise)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        return METHODS.get(loss, Preference)(**{**fields, "loss": loss})

    def configured(self, cfg, model_config=None) -> "Preference":
        """The run's ``preference.*`` as its method (``loss`` auto stays auto until the data is known:
        ``data.for_data``), or, with ``model_config``, what a trained model recorded (``leantrain eval``: against a live
        reference)."""
        if model_config is not None:
            rec = getattr(model_config, RECORD, None) or {}
            loss = {k: type(getattr(self, k))(rec[k]) for k in LOSS_SETTINGS if rec.get(k) is not None}
            settings = {"loss": "dpo", **loss}
            return dataclasses.replace(self, **settings, reference="live", reference_name=rec.get(
                "reference_model")).as_method(settings["loss"])
        p = cfg.preference
        return dataclasses.replace(
            self, loss=p.loss, beta=p.resolved_beta(p.loss), gamma=p.gamma, label_smoothing=p.label_smoothing,
            desirable_weight=p.desirable_weight, undesirable_weight=p.undesirable_weight,
            reference=p.resolved_reference(p.loss, cfg.peft.method != "none"),
            reference_name=None if cfg.model.config or cfg.model.config_type else local_or_hub(cfg.model.name),
        ).with_traits(keeps_dropout=p.dropout == "keep").as_method(p.loss)

    def check_config(self, cfg, task: Task) -> None:  # noqa: ANN001 - a Config
        check_preference_keys(cfg, task)

    def check_format(self, columns: dict) -> None:
        """The pair losses read pairs: the training data (``format``; a run's data.eval of another kind is refused by
        the data side) and ``leantrain eval``'s (``eval_format``, against the loss recorded with the model); no pair
        loss on feedback rows (auto picks kto for them; ``kto.Kto`` checks its own)."""
        for key, fmt in (("data.train", columns.get("format")), ("data.eval", columns.get("eval_format"))):
            if self.loss != "auto" and fmt == "feedback":
                raise UserError(f"{key}: unpaired feedback (prompt / completion / label), but preference.loss="
                                f"{self.loss} compares a chosen and a rejected answer: use preference.loss=kto (or "
                                "auto) for feedback, or chosen / rejected pairs for this loss")

    def method(self, columns: dict) -> str:
        """The loss: as configured; auto: kto on unpaired feedback, else dpo."""
        return self.data.for_data(columns).loss

    # -- what differs by method (the pairs here; ``kto.Kto`` overrides them for feedback rows)
    ref_columns = REF_COLUMNS  # precomputed reference log-probs: chosen, rejected
    input_columns = INPUT_COLUMNS  # the two sequences of a row that tokens/s counts

    def reference_logps(self, model, batch: dict) -> torch.Tensor:
        """(B, 2) fp32: the reference log-probs of each pair's two rows (chosen, rejected; KTO: row, KL row)."""
        if "ref_logps" in batch:
            return batch["ref_logps"].float()
        if self.reference == "none":
            raise ValueError(f"preference.loss={self.loss} needs a reference")
        if self.reference == "live":
            if self.frozen_reference is None:
                raise UserError(f"preference.loss={self.loss} compares with a reference model and none is known "
                                "(a model trained from model.config records none)")
            ref = self.frozen_reference.to(batch["input_ids"].device)  # a no-op once there
            context = self.policy_autocast() if self.policy_autocast is not None else nullcontext()  # policy precision
        else:  # adapter, or precompute's own pass: the model itself, adapters off when it has them
            ref = unwrapped(model)
            context = ref.disable_adapter() if hasattr(ref, "disable_adapter") and hasattr(ref, "peft_config") \
                else nullcontext()
        with context, frozen_forward(ref):
            logps, _ = L.sequence_logps(self.token_losses(ref, lm_batch(batch)), batch["labels"])
        first, second = L.split_pairs(logps)
        return torch.stack([first, second], dim=-1)

    # -- training
    def pair_values(self, model, batch: dict) -> tuple[torch.Tensor, dict]:
        """The per-pair losses (B,) and what evaluation reports of them (rewards, log-probs)."""
        logps, lengths = L.sequence_logps(self.token_losses(model, lm_batch(batch)), batch["labels"])
        first, second = L.split_pairs(logps)
        first_len, second_len = L.split_pairs(lengths)
        ref = None if self.loss in REFERENCE_FREE else self.reference_logps(model, batch)
        p = L.PairLogps(first, second, first_len, second_len,
                        *((ref[:, 0], ref[:, 1]) if ref is not None else ()))
        losses = L.pair_loss(self.loss, p, beta=self.beta, gamma=self.gamma, label_smoothing=self.label_smoothing)
        chosen, rejected = L.rewards(p, self.beta)
        return losses, {"loss": losses, "chosen_reward": chosen, "rejected_reward": rejected, "chosen_logps": first,
                        "rejected_logps": second}

    def step_metrics(self, values: dict, weight: torch.Tensor) -> dict:
        """``{name: (sum, count)}`` under TRL's DPOTrainer names: the chosen and rejected rewards, their margin, and
        how often the chosen one is the larger (``rewards/accuracies``); padding pairs weigh 0."""
        chosen, rejected = values["chosen_reward"].detach(), values["rejected_reward"].detach()
        per_pair = {"rewards/chosen": chosen, "rewards/rejected": rejected, "rewards/margins": chosen - rejected,
                    "rewards/accuracies": (chosen > rejected).to(weight)}
        return {k: ((v * weight).sum(), weight.sum()) for k, v in per_pair.items()}



METHODS: dict[str, type[Preference]] = {}  # loss -> the class of its method, when not this family's (kto.py adds KTO)

PREFERENCE_TASK = register(Preference(
    task_spec(PREFERENCE),
    # a pair's two rows get opposite gradients: no Liger (efficiency.chunked_loss)
    Traits(labels="pairs", unit="pairs", auto_model="AutoModelForCausalLM", loads_as="text-generation",
           token_blocks=True, headline_loss=True, uniform_token_gradients=False, scratch_needs_tokenizer=True,
           progress_keys=("loss", "rewards/margins")),
    CardText("preference tuning", "preference-tuned language model", '"Once upon a time", max_new_tokens=40',
             "generator")))
