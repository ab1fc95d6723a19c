"""The ``preference.*`` section: preference tuning of a causal LM (DPO and its variants, KTO) and reward models."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from leantrain.config.base import Section
from leantrain.config.tasks import PREFERENCE, REWARD_MODEL

PAIRED_LOSSES = ("dpo", "ipo", "simpo", "orpo")
# The range in which each scale means something (key -> (least, most, what leaves it)): beta multiplies log-prob
# differences of order 1-100, so below 1e-4 the loss is ln 2 whatever is learnt (1e-300 is 0 in float32) and above 1e3
# every pair saturates; the KTO weights balance the two kinds of rows (TRL keeps their ratio near 1); gamma and reward
# centring are margins and weights of order 0.01-10.
RANGES = {
    "beta": (1e-4, 1e3, "beta x the log-prob differences is the loss's argument: below 1e-4 the loss is ln 2 "
                        "whatever the model learns, above 1e3 every pair saturates (TRL: 0.1; simpo 2.0)"),
    "desirable_weight": (1e-3, 1e3, "the KTO weights balance desirable against undesirable rows (TRL keeps "
                                    "their ratio near 1)"),
    "undesirable_weight": (1e-3, 1e3, "the KTO weights balance desirable against undesirable rows (TRL keeps "
                                      "their ratio near 1)"),
    "gamma": (0.0, 1e3, "simpo's margin is in units of beta x a mean token log-prob (TRL: 0.5)"),
    "center_rewards": (0.0, 1e3, "the reward-centring weight (TRL suggests 0.01)"),
}
REFERENCE_FREE = ("simpo", "orpo")  # losses that need no reference model


class PreferenceConfig(Section):
    """Preference tuning: model.task=preference (chosen/rejected pairs or prompt/completion/label feedback on a
    causal LM) and model.task=reward-model (chosen/rejected pairs on a sequence classifier)."""

    loss: Literal["auto", "dpo", "ipo", "simpo", "orpo", "kto"] = Field(
        "auto", description="auto: dpo (sigmoid) for chosen/rejected pairs, kto for prompt/completion/label feedback; "
        "ipo: squared margin; simpo: length-normalised, no reference (preference.gamma); orpo: odds ratio + the SFT "
        "loss of the chosen, no reference; kto: unpaired desirable / undesirable completions"
    )
    beta: float | None = Field(
        None, gt=0, description="the reward scale (DPO / IPO / KTO: the KL penalty; SimPO: the reward scale; ORPO: "
        "the odds-ratio weight); unset: 0.1 (simpo: 2.0)"
    )
    gamma: float = Field(0.5, ge=0, description="simpo: the target reward margin, subtracted from beta x the "
                         "difference of the length-normalised log-probs (TRL's simpo_gamma)")
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="dpo: the probability that a pair's labels are flipped (conservative DPO)")
    desirable_weight: float = Field(1.0, gt=0, description="kto: the weight of the desirable completions' losses")
    undesirable_weight: float = Field(1.0, gt=0, description="kto: the weight of the undesirable completions' losses")
    reference: Literal["auto", "adapter", "precompute", "live", "none"] = Field(
        "auto", description="where the reference log-probs come from. auto: adapter with LoRA, precompute without, "
        "none for simpo/orpo; adapter: the same model with its LoRA adapters switched off (no copy); precompute: "
        "computed once before training and cached on disk beside the data (keyed by the model and the data), read "
        "per batch; live: a frozen copy of the model in memory; none: reference-free losses only"
    )
    dropout: Literal["off", "keep"] = Field(
        "off", description="preference tuning and reward models: off = every dropout of the model (and of LoRA's "
        "branch) at 0 while training, as TRL's disable_dropout=True: the policy's log-probs are the ones its "
        "reference sees, and a BERT-style model's attention keeps SDPA's fused CPU kernel (which has no dropout: "
        "the reward model's peak 0.63x, benchmarks/results/reward-model.md); keep = the model's own dropout"
    )
    center_rewards: float = Field(
        0.0, ge=0, description="reward model: the weight of the reward-centring term, mean((r_chosen + r_rejected)^2) "
        "(TRL's center_rewards_coefficient; 0.01 in Eisenstein et al.); 0 = off"
    )

    @field_validator(*RANGES)
    @classmethod
    def _meaningful(cls, v: float | None, info) -> float | None:  # noqa: ANN001
        """Each scale within the range where it changes the loss as meant (``RANGES``)."""
        low, high, why = RANGES[info.field_name]
        if v is not None and not low <= v <= high and not (v == 0 and low == 0):
            raise ValueError(f"{v:g} is outside {low:g} .. {high:g}: {why}")
        return v

    def resolved_beta(self, loss: str) -> float:
        return self.beta if self.beta is not None else (2.0 if loss == "simpo" else 0.1)

    def resolved_reference(self, loss: str, lora: bool) -> str:
        """The reference: as set, or auto's (none for the reference-free losses, adapter with LoRA, else precompute)."""
        if self.reference != "auto":
            return self.reference
        return "none" if loss in REFERENCE_FREE else ("adapter" if lora else "precompute")


# The preference.* keys each method reads beside preference.loss and preference.dropout (which every preference
# method reads; a reward model reads dropout and not loss). A key set to other than its default that the run's method
# does not read is refused (exit 2) naming it: a setting that changes nothing must not look as if it did.
READS = {
    "dpo": ("beta", "label_smoothing", "reference"),
    "ipo": ("beta", "reference"),
    "kto": ("beta", "desirable_weight", "undesirable_weight", "reference"),
    "simpo": ("beta", "gamma"),
    "orpo": ("beta",),
    REWARD_MODEL: ("center_rewards",),
}
NEEDS_REFERENCE = tuple(m for m, keys in READS.items() if "reference" in keys)
# data.* keys no preference method reads (pairs and feedback rows are rendered whole, one row per pair), with why.
DATA_UNREAD = {
    "packing": (True, "a pair's (or feedback row's) sequences are rows of their own, never packed together"),
    "train_on_prompt": (True, "a preference loss compares the answers' log-probs; the prompt is never a target"),
}


def _unread(key: str, method: str) -> str:
    """Why ``method`` does not read ``preference.<key>``, and what does."""
    users = [m for m, keys in READS.items() if key in keys]
    if key == "reference":
        return (f"{method} is reference-free: a reference (precompute's pass, a live copy, the adapter) would be "
                "computed and never used; leave preference.reference unset (auto)") if method != REWARD_MODEL else \
            "a reward model compares its own two scores, with no reference; leave preference.reference unset (auto)"
    if key == "loss":
        return ("a reward model trains with the Bradley-Terry loss of its two scores; preference.loss chooses the loss "
                "of model.task=preference (a causal LM)")
    return f"{method} does not read it (it is for {' and '.join(users)}); leave it unset"


def check_method_keys(pref: PreferenceConfig, data, method: str | None) -> None:  # noqa: ANN001 - DataConfig
    """The preference.* and data.* keys the run's ``method`` (a loss of ``READS``, or reward-model) does not read,
    refused with ValueError naming the key and why; None or another task's name: nothing to check. The one place the
    method's keys are checked: at config time when the method is known from the config alone
    (``check_preference``), else once the data says it (``Task.method``: loss auto -> dpo on pairs, kto on feedback)."""
    if method not in READS:
        return
    reads = READS[method]
    if method in NEEDS_REFERENCE and pref.reference == "none":
        raise ValueError(f"preference.reference=none: {method} compares the policy with a reference; "
                         "preference.reference=none is for the reference-free losses (simpo, orpo): use "
                         "preference.reference=auto")
    for key, field in type(pref).model_fields.items():
        value = getattr(pref, key)
        if key in ("dropout", *reads) or (key == "loss" and method != REWARD_MODEL) or \
                value == field.get_default(call_default_factory=True) or (key == "reference" and value == "none"):
            continue
        raise ValueError(f"preference.{key}={_text(value)}: {_unread(key, method)}")
    for key, (value, why) in DATA_UNREAD.items():
        if getattr(data, key) == value:
            raise ValueError(f"data.{key}={_text(value)}: not for {method} ({why}); leave it unset")


def _text(value) -> str:  # noqa: ANN001
    return str(value).lower() if isinstance(value, bool) else f"{value:g}" if isinstance(value, float) else str(value)


def config_method(pref: PreferenceConfig, task: str) -> str | None:
    """The method a config names on its own (model.task=reward-model, or an explicit preference.loss under
    model.task=preference / auto); None when the data decides (loss auto) or the task takes no preference keys."""
    if task == REWARD_MODEL:
        return task
    return pref.loss if task in (PREFERENCE, "auto") and pref.loss != "auto" else None


def check_preference(pref: PreferenceConfig, peft_method: str, data=None, task: str = "auto") -> None:  # noqa: ANN001
    """The choices that contradict each other, before any data or model: adapter without LoRA, and the keys of the
    method the config names (``check_method_keys``: a reference-needing loss with reference=none, a key the method
    does not read)."""
    if pref.reference == "adapter" and peft_method == "none":
        raise ValueError("preference.reference=adapter is the model with its LoRA adapters switched off: it needs "
                         "peft.method=lora (or qlora); without LoRA use preference.reference=precompute or live")
    if data is not None:
        check_method_keys(pref, data, config_method(pref, task))
