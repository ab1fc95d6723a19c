"""The ``distill.*`` section: knowledge distillation of a causal LM (``model.task=distill``): a frozen teacher scores
every token of a completion, the student learns its distribution (TRL's GKDTrainer: ``lmbda``, ``beta``, ``seq_kd``,
``temperature``, the same meanings). ``train.batch_size`` counts prompts; each step's completions are the student's
own samples (on-policy, with probability ``lmbda``) or the data's (off-policy; the teacher's own samples with
``seq_kd``)."""

from __future__ import annotations

from pydantic import Field

from leantrain.config.base import Section
from leantrain.errors import ConfigError


class DistillConfig(Section):
    """Distillation (model.task=distill): a student learns a teacher's next-token distribution on completions it
    samples itself (on-policy distillation) or on the data's (knowledge distillation, KD)."""

    teacher: str | None = Field(None, description="the teacher: a model folder, a Hub id or a preset (smollm2-135m); "
                                "loaded frozen in the run's precision on the student's device; it must share the "
                                "student's tokenizer (the same vocabulary: cross-tokenizer distillation is not "
                                "supported)")
    lmbda: float = Field(1.0, ge=0, le=1, description="the share of steps trained on the student's own samples "
                         "(TRL's lmbda): 1 = on-policy distillation (prompts suffice), 0 = the data's completions "
                         "(prompt + completion rows, or distill.seq_kd), between: each step drawn (seeded)")
    beta: float = Field(1.0, ge=0, le=1, description="the divergence per token, the generalised Jensen-Shannon "
                        "(TRL's beta): 0 = forward KL(teacher || student) (mode covering: KD's), 1 = reverse "
                        "KL(student || teacher) (mode seeking: on-policy distillation's), between = beta KL(teacher "
                        "|| m) + (1 - beta) KL(student || m) with m = beta teacher + (1 - beta) student")
    temperature: float = Field(1.0, gt=0, description="the sampling temperature of the student's completions and "
                               "of both models' distributions in the loss (TRL's temperature); 1 = as they are")
    max_new_tokens: int = Field(64, gt=0, description="tokens a sampled completion may have; the data's "
                                "completions are cut there too")
    teacher_top_k: int = Field(0, ge=0, description="compare the two distributions on the teacher's k most likely "
                               "tokens plus one bucket holding the rest of each model's mass (the tail), as ART "
                               "keeps top-k teacher log-probs; 0 = the whole vocabulary")
    seq_kd: bool = Field(False, description="off-policy steps train on the teacher's own samples of the prompts "
                         "(sequence-level KD, TRL's seq_kd) instead of the data's completions")
    stop: list[str] = Field(default_factory=list, description="strings that end a sampled completion as its EOS "
                            "does, kept in it (grpo.stop's meaning)")
    log_completions: int = Field(4, ge=0, description="completions written to completions.jsonl at each logging "
                                 "step (prompt, completion, whose samples); 0 = none")


def check_distill_keys(cfg, task, owner: bool) -> None:  # noqa: ANN001 - a Config, a leantrain.methods Task
    """distill.* keys are for distillation (``owner``: the run's task is it) only, and distillation needs a teacher. A
    key counts as given when its value is not the default (the workers read the resolved config)."""
    if owner and not cfg.distill.teacher:
        raise ConfigError(f"distill.teacher: {task.name} learns from a teacher model and none is given; e.g. "
                          "distill.teacher=path/to/teacher (a folder, a Hub id or a preset sharing the student's "
                          "tokenizer)")
    given = cfg.distill.changed_keys()
    if given and not owner:
        raise ConfigError(f"distill.{given[0]}: for distillation (model.task=distill) only; this run's task is "
                          f"{task.name}")
