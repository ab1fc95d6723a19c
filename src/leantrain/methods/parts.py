"""The parts a method is made of, each one concern with its defaults: ``Data`` (how it reads and counts its data),
``Model`` (what its model is and how it is bound before training), ``Step`` (its batches, forward, loss and step
metrics: the training step's seam, ``leantrain.methods.seam``), ``Evaluation``, ``Prediction`` and ``Report`` (summary,
saved config, model card, plan lines). A method (``registry.Task``) names the part classes it changes in its
``parts`` record (``Parts``); the others are these. A part reads its method's description and settings through
``self.task``; a part may hold caches of its own (per-device tensors, per-dataset counts), never the description.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from leantrain.data.modalities import Modality, for_modality
from leantrain.errors import ConfigError
from leantrain.methods.seam import StepBatches, StepContext
from leantrain.modeling.from_scratch import from_scratch
from leantrain.modeling.load import load_tokenizer
from leantrain.modeling.pad_token import set_model_pad_token
from leantrain.modeling.pooling import apply_pooling

NOT_MODEL_INPUTS = ("labels", "loss_weight", "length")  # batch columns the loss or the batching reads, not the model
TOKEN_KEYS = ("block_size", "document_separator", "document_mask",  # language models: how text becomes blocks
              "template", "train_on_prompt", "train_on_empty_think",  # instruction data: how it is rendered,
              "system_prompt",  # which tokens learn
              "max_prompt_length")  # preference data: how much of a long prompt is kept
RENDERING_KEYS = ("format", "prompt")  # instruction / preference data: the format its prompts were rendered in


def model_inputs(batch: dict) -> dict:
    """The model's keyword arguments of a batch. With ``position_ids`` (packed rows: positions restart per document or
    example) also ``use_cache=False``: transformers builds the block-diagonal mask from restarting positions only when
    there is no cache, and a causal LM's forward makes one by default (config.use_cache), even in training."""
    inputs = {k: v for k, v in batch.items() if k not in NOT_MODEL_INPUTS}
    if "position_ids" in inputs:
        inputs["use_cache"] = False
    return inputs


class Part:
    """One concern of a method: ``task`` is the method it belongs to (its description, traits and settings)."""

    def __init__(self, task) -> None:  # noqa: ANN001 - a registry.Task
        self.task = task


class Data(Part):
    """How the method reads, checks and counts its data."""

    def side(self) -> Modality:
        """The data side (``leantrain.data.modalities.Modality``: loader, processor step, collator) the method reads
        with: its modality's (``spec.modality``) by default; a method adapts it (its own label reading, processing or
        collator: ``dataclasses.replace``). The engine asks the method, never the table of data sides."""
        return for_modality(self.task.spec.modality)

    def sequence_length(self, data) -> int:  # noqa: ANN001 - a DataConfig
        """The tokens a row is cut at: ``data.block_size`` for token-block methods (language models, preference pairs,
        a reward model's pairs), else ``data.max_length``. Recorded with the model as its ``max_length`` (and as its
        saved tokenizer's ``model_max_length``), so that predict, eval and ``pipeline(..., truncation=True)`` cut
        where training did."""
        return data.block_size if self.task.traits.token_blocks else data.max_length

    def saved_settings(self, data, columns: dict) -> tuple[dict, dict]:  # noqa: ANN001 - a DataConfig
        """(data settings, prompt rendering) kept with the trained model beside its columns and length, so that its
        ``leantrain eval`` cuts and renders text as the run did: a token-block method's ``TOKEN_KEYS`` and the format
        its prompts were rendered in (``RENDERING_KEYS`` of the detected ``columns``); none for the others."""
        if not self.task.traits.token_blocks:
            return {}, {}
        return {k: getattr(data, k) for k in TOKEN_KEYS}, {k: columns[k] for k in RENDERING_KEYS if columns.get(k)}

    def with_processor(self, processor):  # noqa: ANN001, ANN201 - a tokenizer, image processor...; a Task
        """The method bound to the run's processor (the one its collators are built with): a method that decodes
        what it generates keeps it (GRPO); the method itself by default."""
        return self.task

    def check(self, columns: dict, cfg=None) -> None:  # noqa: ANN001 - a Config
        """Raise a UserError (exit 2, before any model loads) for settings the loaded data contradicts (``columns``:
        what the data side detected, e.g. ``{"format": ...}``; preference.loss=kto on pairs); with the run's ``cfg``
        (training) also the keys the method this data selects does not read (preference.loss=auto: kto's on pairs).
        Nothing by default."""

    def for_data(self, columns: dict):  # noqa: ANN201 - a Task
        """The method for data the data side described by ``columns`` (the training data's ``format``, or ``leantrain
        eval``'s ``eval_format``): the one that trains on it (preference.loss=auto: KTO on feedback, DPO on pairs).
        The method itself by default."""
        return self.task

    def for_training(self, labels, label_names: list[str]):  # noqa: ANN001, ANN201 - a callable; a Task
        """The method for training on data with these labels (``labels``: a callable returning the training labels,
        read only by a method that needs them; multi-label: ``train.pos_weight=balanced``). Raises a UserError for
        settings the data contradicts (exit 2). The method itself by default."""
        return self.task

    def generated_tokens(self) -> tuple[int, str] | None:
        """(tokens the method generates after each prompt of its data, the key that sets it): an online method's room
        in the model's positions beside its prompts; None (it generates nothing) by default."""
        return None

    def count(self, dataset, indices) -> int | float:  # noqa: ANN001
        """How many units the examples ``indices`` of the processed training ``dataset`` hold (on the host)."""
        return len(indices)

    def throughput_tokens(self, dataset, indices) -> int | None:  # noqa: ANN001
        """The tokens tokens/s counts in these training examples, or None: the data side's non-padding input tokens
        (causal LM: its target tokens)."""
        return None

    def precomputed_columns(self, columns: list[str]) -> tuple[str, ...]:
        """Float columns of a processed dataset (with these ``columns``) that the engine computes once with
        ``precompute`` on the model as it starts training, caches on disk and adds to the rows, so that batches carry
        them (the preference methods' reference log-probs); none by default."""
        return ()

    def precompute(self, model, batch: dict):  # noqa: ANN001, ANN201
        """The ``precomputed_columns`` of a batch, a ``(rows, columns)`` fp32 tensor (called under no_grad)."""
        raise NotImplementedError


class Model(Part):
    """What the method's model is, and how it is bound to the run before training."""

    def auto_class(self):  # noqa: ANN201 - a transformers Auto class
        import transformers  # lazy: heavy

        return getattr(transformers, self.task.traits.auto_model)

    def fields(self, label_names: list[str]) -> dict:
        """The model config fields the method sets for the data's labels (num_labels, label maps, problem_type)."""
        return dict(num_labels=len(label_names), id2label={i: n for i, n in enumerate(label_names)},
                    label2id={n: i for i, n in enumerate(label_names)})

    def check_keys(self, cfg) -> None:  # noqa: ANN001 - a ModelConfig
        """Exit 2 naming the key, before any weight loads: a method whose model from a config takes its vocabulary from
        ``model.tokenizer`` (``traits.scratch_needs_tokenizer``: a causal LM) needs that key."""
        if from_scratch(cfg) and self.task.traits.scratch_needs_tokenizer and not cfg.tokenizer:
            key = "model.config" if cfg.config else "model.config_type"
            raise ConfigError(f"model.tokenizer is required with {key} for model.task={self.task.name}: set "
                              "model.tokenizer=<a tokenizer folder or Hub id> (the vocabulary the new model is trained on)")

    def check_architecture(self, cfg, config) -> None:  # noqa: ANN001 - a leantrain Config, a transformers config
        """Exit 2 before any weight loads when the model (its ``config``) cannot be trained by this method; any model
        its Auto class builds can by default (causal LM: a decoder, ``CausalLMModel``)."""

    def scratch_fields(self, cfg) -> dict:  # noqa: ANN001 - a ModelConfig
        """Config fields of a model built from a config (``model.config`` / ``model.config_type``) that follow its
        processor, which it loads from ``cfg`` when it needs it (causal LM: the tokenizer's vocabulary size and special
        tokens); none by default."""
        return {}

    def finish(self, model, cfg):  # noqa: ANN001, ANN201 - a model, a ModelConfig
        """A built or loaded model made ready for the method: a sequence classifier's pooler as ``model.pooling`` says
        (``leantrain.modeling.pooling``, an untrained-looking BERT pooler as its traits say), and a text model whose
        config has no pad_token_id given the tokenizer's (GPT-2, Llama, ...)."""
        traits = self.task.traits
        if traits.sequence_classifier:
            apply_pooling(model, cfg.pooling, traits.untrained_pooler)
        if traits.tokenized and getattr(model.config, "pad_token_id", None) is None:
            set_model_pad_token(model, load_tokenizer(cfg, say=False))
        return model

    def start_head(self, model) -> str | None:  # noqa: ANN001
        """Set a freshly built model's new head before training (multi-label: its bias at the labels' prior); returns
        a line for the log, or None (nothing done, the default)."""
        return None

    def bind(self, model, autocast=None):  # noqa: ANN001, ANN201 - a Task
        """The method bound to the built model, before training and before a resume restores trained weights (the
        preference methods' ``live`` reference: a frozen copy made here). ``autocast``: a callable giving the
        precision context the model's forward runs in (the Accelerator's ``autocast``), for the other models a method
        runs beside it. The method itself by default."""
        return self.task

    def merge_check_value(self, model, batch: dict):  # noqa: ANN001, ANN201
        """A number of the model alone that merging LoRA into its weights must keep (checked after every merge): the
        loss by default; a method whose loss compares with the adapters switched off (preference) returns the
        model's own log-probs instead."""
        return self.task.step.forward_loss(model, batch)[0]

    def calibration_labels(self, model, input_ids):  # noqa: ANN001, ANN201
        """The labels of a synthetic batch of ``input_ids [m, T]`` (the memory model's calibration passes run
        ``Step.forward_loss`` on it): one class per row (0) by default."""
        import torch  # lazy: heavy

        return torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)

    def calibration_batch(self, batch: dict) -> dict:
        """The memory model's synthetic ``batch`` (input ids, attention mask, ``calibration_labels``, weights) with
        what the method's training batches carry beside (the preference methods' precomputed reference log-probs, so
        that the passes run no reference forward where training runs none); as it is by default."""
        return batch


class Step(Part):
    """The training step's seam (``leantrain.methods.seam``): what a global step trains on, the forward, the loss and
    the step metrics."""

    def batches(self, ctx: StepContext, micro_batches: list[dict], count) -> StepBatches:  # noqa: ANN001
        """What the global step trains on (``ctx``: the model, the Accelerator, the step, ``state``'s object), given
        this process's ``micro_batches`` as loaded and the host ``count`` of their units: as loaded, that count and
        one update by default."""
        return StepBatches(micro_batches, count)

    def state(self, seed: int, rank: int):  # noqa: ANN201
        """An object (``state_dict()`` / ``load_state_dict()``) the method's steps carry across a resume, checkpointed
        per process and handed to ``batches`` as ``ctx.state``; None (nothing) by default."""
        return None

    def loss(self, model, batch: dict) -> tuple:  # noqa: ANN001
        """(loss_sum, step_metrics): what the training step calls on each micro-batch. ``step_metrics`` is ``{name:
        (sum, count)}`` of device tensors, the same names at every call, logged as ``sum / count`` over the
        micro-batches, steps and processes since the last log. ``forward_loss``'s sum and no metrics by default."""
        return self.forward_loss(model, batch)[0], {}

    def forward(self, model, batch: dict):  # noqa: ANN001, ANN201
        """The model's forward on ``batch``: its outputs (``model(**model_inputs(batch))``)."""
        return model(**model_inputs(batch))

    def forward_loss(self, model, batch: dict) -> tuple:  # noqa: ANN001
        """(loss_sum, outputs): the sum of the per-unit losses of ``batch`` (an fp32 device tensor, padding units weigh
        0) and what the forward returned (may be None). ``forward`` then ``loss_sum`` by default."""
        outputs = self.forward(model, batch)
        return self.loss_sum(outputs, batch), outputs

    def loss_sum(self, outputs, batch: dict):  # noqa: ANN001, ANN201
        """The sum of the per-unit losses of ``batch`` from the forward's ``outputs`` (a device tensor, fp32; padding
        units weigh 0)."""
        raise NotImplementedError


class Evaluation(Part):
    """Evaluation: what one eval batch gathers, the metrics of the whole set, the headline; what ``leantrain eval``
    needs beside the model (a reference)."""

    def outputs(self, model, batch: dict) -> tuple:  # noqa: ANN001
        """What one eval batch gathers over the processes (``gather_for_metrics``), then handed to ``batch``; the
        forward happens here (the engine calls this under ``no_grad``): the fp32 logits and the labels by default;
        a method may gather less (causal LM: per-row loss sums and counts)."""
        return self.task.step.forward(model, batch).logits.float(), batch["labels"]

    def batch(self, logits, labels) -> dict:  # noqa: ANN001
        """Per-unit values of one gathered eval batch (tensors), concatenated over the eval set for ``metrics``."""
        raise NotImplementedError

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        """The eval metrics (the names of ``spec.metrics``) and ``samples`` from the concatenated ``batch`` values."""
        raise NotImplementedError

    def label_metrics(self, values: dict[str, np.ndarray], label_names: list[str]) -> dict:
        """Per-label values added to the eval metrics, keyed by label name (classification: ``recall_per_class``);
        none by default."""
        return {}

    def all_metrics(self, values: dict[str, np.ndarray], label_names: list[str]) -> dict:
        """``metrics`` and ``label_metrics``: what an evaluation reports."""
        return {**self.metrics(values, len(label_names)), **self.label_metrics(values, label_names)}

    def headline(self, ev: dict) -> str:
        """The eval result in one line, as ``leantrain train`` prints it at the end."""
        return "eval " + "  ".join(f"{k}: {ev[k]:.4f}" for k in self.task.spec.metrics if k in ev)

    def row_labels(self, rows, processed):  # noqa: ANN001, ANN201
        """The labels of labelled ``rows`` (``leantrain eval``), as ``batch`` takes them with the logits of the
        ``processed`` rows; the canonical ``label`` column by default."""
        import torch  # lazy: heavy

        return torch.as_tensor(np.asarray(rows["label"]))

    def check_generates(self, key: str) -> None:
        """``key`` (a setting that generates text with the model: ``report.sample_prompts``, ``eval.harness_tasks``)
        needs a method whose model generates (``traits.generates``): a ConfigError (exit 2) naming it otherwise."""
        if not self.task.traits.generates:
            raise ConfigError(f"{key} is for language models (model.task=causal-lm, sft, grpo, ...): it generates "
                              f"text with the model; this run trains a {self.task.name} model")

    def reference_model_name(self) -> str | None:
        """A model ``leantrain eval`` loads beside a trained one of this method (the preference methods: the reference
        it was tuned against, as recorded), then hands to ``with_reference``; None by default."""
        return None

    def check_evaluable(self) -> None:
        """``leantrain eval``, before any weight or data loads, on the method as the model recorded it
        (``configured(cfg, model_config)``): a UserError when the trained model cannot be evaluated again (a
        preference policy whose reference was never saved); nothing by default."""

    def with_reference(self, model, autocast=None):  # noqa: ANN001, ANN201 - a Task
        """The method evaluating against ``model`` (frozen), run under ``autocast()`` (the policy's precision context;
        None: as called); the method itself by default."""
        return self.task


class Prediction(Part):
    """``leantrain predict``: one record per row."""

    def check(self, model_dir: str) -> None:
        """A UserError (exit 2) when a trained model of this method has nothing to predict; nothing by default."""

    def shown(self, rows) -> dict[str, list]:  # noqa: ANN001 - a datasets.Dataset
        """What each prediction carries beside its label when no id column is given: its file (images, audio), else
        its text columns."""
        if self.task.traits.media_inputs:
            return {"path": rows[self.task.spec.modality]}
        return {k: rows[k] for k in ("text", "text_pair", "tokens") if k in rows.column_names}

    def records(self, logits, label_names: list[str]) -> list[dict]:  # noqa: ANN001
        """One record per row: e.g. {"label": ..., "score": ...}."""
        raise NotImplementedError

    def rows(self, logits, label_names: list[str], rows, processed) -> list[dict]:  # noqa: ANN001
        """``records`` for the canonical ``rows`` and their ``processed`` form, in row order (what a method that
        predicts per word needs: token classification); ``records(logits)`` by default."""
        return self.records(logits, label_names)


class Report(Part):
    """What the method adds to what a run writes and prints: summary.json, the saved config, the model card, plan."""

    def summary(self, label_names: list[str]) -> dict:
        """Entries of summary.json's ``train`` section (multi-label: ``pos_weight``); none by default."""
        return {}

    def saved_config(self, ev: dict | None) -> dict:
        """Fields the model's config.json gets beyond ``Model.fields``: before training (``ev`` None: checkpoints carry
        them; regression: ``target_standardization``) and from the final evaluation ``ev`` (multi-label: the tuned
        ``threshold``); ``configured(cfg, model_config)`` reads them back. None by default."""
        return {}

    def card_notes(self, model_config: dict) -> list[str]:
        """Markdown lines the model card adds for a saved model of this method (its config.json as a dict)."""
        return []

    def card_rows(self, summary: dict, config: dict) -> list[tuple[str, object]]:
        """(name, value) rows the model card adds under "Training data" (causal LM: corpus, tokens seen, block size,
        perplexity); none by default."""
        return []

    def plan(self, model, per_process: int, precision: str) -> dict:  # noqa: ANN001
        """What ``leantrain plan`` adds for this method and model, for ``per_process`` examples a process takes per
        optimizer step, in ``precision`` (resolved: fp32, bf16, fp16) (the preference methods:
        the memory and time of each reference choice; GRPO: its generation's memory); nothing by default."""
        return {}


@dataclass(frozen=True)
class Parts:
    """The part classes of a method: these by default; a method replaces the ones it changes."""

    data: type[Data] = Data
    model: type[Model] = Model
    step: type[Step] = Step
    evaluation: type[Evaluation] = Evaluation
    prediction: type[Prediction] = Prediction
    report: type[Report] = Report
