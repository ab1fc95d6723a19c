"""The ``preference.*`` section: preference tuning of a causal LM (DPO and its variants, KTO) and reward models."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from leantrain.config.base import Section

PAIRED_LOSSES = ("dpo", "ipo", "simpo", "orpo")
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
        "the reward model's peak 0.63x, benchmarks/RESULTS.md); keep = the model's own dropout"
    )
    center_rewards: float = Field(
        0.0, ge=0, description="reward model: the weight of the reward-centring term, mean((r_chosen + r_rejected)^2) "
        "(TRL's center_rewards_coefficient; 0.01 in Eisenstein et al.); 0 = off"
    )

    def resolved_beta(self, loss: str) -> float:
        return self.beta if self.beta is not None else (2.0 if loss == "simpo" else 0.1)

    def resolved_reference(self, loss: str, lora: bool) -> str:
        """The reference: as set, or auto's (none for the reference-free losses, adapter with LoRA, else precompute)."""
        if self.reference != "auto":
            return self.reference
        return "none" if loss in REFERENCE_FREE else ("adapter" if lora else "precompute")


def check_preference(pref: PreferenceConfig, peft_method: str) -> None:
    """The choices that contradict each other, before any data or model: a reference-needing loss with
    reference=none, adapter without LoRA."""
    if pref.reference == "none" and pref.loss in ("dpo", "ipo", "kto"):
        raise ValueError(f"preference.loss={pref.loss} compares the policy with a reference; preference.reference=none "
                         f"is for the reference-free losses (simpo, orpo): use preference.reference=auto")
    if pref.reference == "adapter" and peft_method == "none":
        raise ValueError("preference.reference=adapter is the model with its LoRA adapters switched off: it needs "
                         "peft.method=lora (or qlora); without LoRA use preference.reference=precompute or live")
