"""Tasks: the task registry (``registry``: the ``Task`` base, ``register``, ``get_task``, auto-detection) and one
module per task (``classification``: text, image and audio classification; ``regression``: text regression;
``multilabel``: multi-label text classification; ``token_classification``: tags per word, NER; ``causal_lm``: causal
language modelling; ``preference``: the DPO family; ``kto``: KTO; ``reward_model``: reward models; ``grpo``: GRPO,
online RL on prompts), each declaring what it is once (``traits``: ``Traits``);
``detect``: what ``model.task=auto`` decides from the model's config and the data keys, and
what tasks share (``row_counts``: per-row counts of the training data, read once).
Importing this package registers the built-in tasks."""

from leantrain.modeling.tasks.registry import (AUDIO, IMAGE, TASKS, TEXT, CardText, Task, auto_model_class,
                                               check_config, default_task, get_task, modality_of, model_inputs,
                                               register, task_for_labels, task_of_config)
from leantrain.modeling.tasks.traits import Traits
from leantrain.modeling.tasks import classification, multilabel, regression, token_classification  # noqa: F401  (register the built-in tasks)
from leantrain.modeling.tasks import causal_lm  # noqa: F401, E402  (registered last: model.task lists it last)
from leantrain.modeling.tasks import kto, preference, reward_model  # noqa: F401, E402  (preference, KTO, reward models)
from leantrain.modeling.tasks import grpo  # noqa: F401, E402  (GRPO: online RL on prompts)

__all__ = ["AUDIO", "IMAGE", "TASKS", "TEXT", "CardText", "Task", "Traits", "auto_model_class", "check_config",
           "default_task", "get_task", "modality_of", "model_inputs", "register", "task_for_labels", "task_of_config"]
