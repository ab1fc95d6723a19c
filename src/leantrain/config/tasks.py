"""The names of the methods (tasks) and what the config checks need of each (``model.task``, the metrics
``train.stop_when`` / ``checkpoint.best_metric`` may name, the problem_type an override must match): one ``TaskSpec``
per method, every built-in one declared in the table below.

This is the light index of the one method registry (``leantrain.methods``), importable by every layer: the config is
checked against it before torch or any model loads. A method object carries its spec; ``methods.register`` adds the
spec of a method registered from outside (a plug-in, a test's method), so a new method is one module and one
``register`` call. The engine never reads this table: it asks the method.
"""

from __future__ import annotations

from dataclasses import dataclass

TEXT, IMAGE, AUDIO = "text-classification", "image-classification", "audio-classification"
TEXT_REGRESSION = "text-regression"
MULTI_LABEL = "multi-label"
TOKEN_CLASSIFICATION = "token-classification"
CAUSAL_LM = "causal-lm"
PREFERENCE = "preference"
REWARD_MODEL = "reward-model"
GRPO = "grpo"
DISTILL = "distill"

CLASSIFICATION_METRICS = ("accuracy", "f1_macro", "mcc", "loss")  # mcc: two classes only
REGRESSION_METRICS = ("pearson", "spearman", "mse", "mae", "loss")
MULTI_LABEL_METRICS = ("f1_micro", "f1_macro", "subset_accuracy", "loss")
PREFERENCE_METRICS = ("reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward", "chosen_logps",
                      "rejected_logps", "loss", "kl")  # TRL's meanings; kl: KTO's estimate
REWARD_MODEL_METRICS = ("accuracy", "margin", "loss")
TOKEN_CLASSIFICATION_METRICS = ("entity_f1", "entity_precision", "entity_recall", "token_accuracy", "loss")


@dataclass(frozen=True)
class TaskSpec:
    """What is known of a task before any data or model: its name (``model.task``), the data side it reads
    (``text``, ``image``, ``audio``: ``leantrain.data.modalities``), transformers' ``problem_type``, the metrics
    evaluation reports (``eval.<name>``; ``two_class_only`` ones only for 2 labels; ``lower_is_better`` ones pick
    the best model by their minimum). What the task is beyond that (its labels, units, what its saved model loads
    as) is its traits record (``leantrain.methods.traits``)."""

    name: str
    modality: str
    problem_type: str
    metrics: tuple[str, ...]
    two_class_only: tuple[str, ...] = ()
    lower_is_better: tuple[str, ...] = ("loss",)


SPECS: dict[str, TaskSpec] = {}


def register_spec(spec: TaskSpec) -> TaskSpec:
    """Add (or replace) a task's spec; ``model.task`` then accepts its name."""
    SPECS[spec.name] = spec
    return spec


def task_names() -> list[str]:
    return list(SPECS)


def task_spec(name: str) -> TaskSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(SPECS)}") from None


for _name, _modality in ((TEXT, "text"), (IMAGE, "image"), (AUDIO, "audio")):
    register_spec(TaskSpec(_name, _modality, "single_label_classification", CLASSIFICATION_METRICS, ("mcc",)))
register_spec(TaskSpec(TEXT_REGRESSION, "text", "regression", REGRESSION_METRICS,
                       lower_is_better=("mse", "mae", "loss")))
register_spec(TaskSpec(MULTI_LABEL, "text", "multi_label_classification", MULTI_LABEL_METRICS))
register_spec(TaskSpec(TOKEN_CLASSIFICATION, "tagged", "token_classification", TOKEN_CLASSIFICATION_METRICS))
register_spec(TaskSpec(CAUSAL_LM, "tokens", "", ("loss", "perplexity"), lower_is_better=("loss", "perplexity")))
register_spec(TaskSpec(PREFERENCE, "pairs-or-feedback", "", PREFERENCE_METRICS))
register_spec(TaskSpec(REWARD_MODEL, "scored-pairs", "regression", REWARD_MODEL_METRICS))
register_spec(TaskSpec(GRPO, "prompts", "", ("reward",), lower_is_better=()))  # the eval reward is its metric
register_spec(TaskSpec(DISTILL, "prompts", "", ("kl", "reverse_kl", "forward_kl"),  # the eval divergence to the teacher
                       lower_is_better=("kl", "reverse_kl", "forward_kl")))
