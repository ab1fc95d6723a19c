"""Methods (``model.task``): the registry (``registry``: the ``Task`` base, ``register``, ``get_task``) and one module
per method, in a folder per family: ``classify`` (text, image and audio classification, regression, multi-label,
tags per word), ``lm`` (causal language modelling), ``preference`` (the DPO family, KTO, reward models), ``grpo``
(online RL on prompts), ``distill`` (a student taught by a teacher model). Each declares what it is once (``traits``: ``Traits``); ``seam`` is what a step asks of a
method (its batches, loss and metrics); ``detect`` is what ``model.task=auto`` decides from the model's config and the
data keys; ``row_counts`` what methods share (per-row counts of the training data, read once).
Importing this package registers the built-in methods."""

from leantrain.methods.registry import (AUDIO, IMAGE, TASKS, TEXT, CardText, Task, auto_model_class, check_config,
                                        default_task, get_task, modality_of, model_inputs, register, task_for_labels,
                                        task_of_config)
from leantrain.methods.parts import TOKEN_KEYS
from leantrain.methods.traits import Traits
from leantrain.methods.classify import classification, multilabel, regression, token_classification  # noqa: F401, E402  (register the built-in tasks)
from leantrain.methods.lm import causal_lm  # noqa: F401, E402  (registered last: model.task lists it last)
from leantrain.methods.preference import kto, preference, reward_model  # noqa: F401, E402  (preference, KTO, reward models)
from leantrain.methods.grpo import grpo  # noqa: F401, E402  (GRPO: online RL on prompts)
from leantrain.methods.distill import distill  # noqa: F401, E402  (distillation from a teacher)
from leantrain.methods.detect import resolve_task, resolve_task_reason  # noqa: E402

__all__ = ["AUDIO", "IMAGE", "TASKS", "TEXT", "TOKEN_KEYS", "CardText", "Task", "Traits", "auto_model_class", "check_config",
           "default_task", "get_task", "modality_of", "model_inputs", "register", "resolve_task",
           "resolve_task_reason", "task_for_labels", "task_of_config"]
