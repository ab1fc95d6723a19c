"""The typed config sections: one pydantic model per component, ``extra="forbid"`` everywhere."""

from __future__ import annotations

import json
import math
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from leantrain.config.metric_names import metric_names
from leantrain.config.tasks import SPECS, task_names
from leantrain.config.problem_type import check_problem_type


MAX_MAGNITUDE = 1e9  # no float key means anything beyond this (train.epochs=1e300 is a typo, not a plan)
MAX_INT = 2**53  # integers beyond exact float range are typos too (and overflow numpy / torch)


def _check_number(v: Any) -> None:
    if isinstance(v, bool):
        return
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        if abs(v) > MAX_MAGNITUDE:
            raise ValueError(f"{v:g} is out of range: at most {MAX_MAGNITUDE:g} in magnitude")
    elif isinstance(v, int) and abs(v) > MAX_INT:
        raise ValueError(f"{v} is out of range: at most 2**53 in magnitude")
    elif isinstance(v, (tuple, list)):
        for item in v:
            _check_number(item)


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="after")
    @classmethod
    def _finite(cls, v: Any) -> Any:
        """Every number of every section (not the free-form model.config_overrides): finite, sane magnitude."""
        _check_number(v)
        return v


class ModelConfig(Section):
    """Which model to train: a pretrained folder or Hub id, or a config to build one from scratch; the task."""

    name: str | None = Field(
        None, description="Hub id or local folder; unset or minilm = the packaged sentence-transformers/all-MiniLM-L6-v2"
    )
    task: str = Field(
        "auto", description="auto: from the model's config (its model type), else data.image_column / "
        "data.audio_column, else text-classification; text labels that are numbers, not all whole: text-regression",
        json_schema_extra={"choices": "tasks"},  # the task registry's names (leantrain.config.tasks)
    )
    config: str | None = Field(
        None, description="train from scratch: a local config.json (or a folder holding one); model.name is then "
        "used only for a text model's tokenizer"
    )
    config_type: str | None = Field(
        None, description="train from scratch from a model type's default config (e.g. vit, convnext, resnet, "
        "wav2vec2, audio-spectrogram-transformer) plus model.config_overrides"
    )
    tokenizer: str | None = Field(None, description="causal LM: the tokenizer (a local folder or Hub id); required with model.config / model.config_type")
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit) to pin")
    trust_remote_code: bool = Field(False, description="run code from the model repo (pin a revision when on)")
    allow_pickle: bool = Field(False, description="allow pickle-based weight files (*.bin); default safetensors only")
    config_overrides: dict[str, Any] = Field(
        default_factory=dict, description="applied to the model's config, e.g. hidden_dropout_prob: 0"
    )
    reuse_head: Literal["auto", "always", "never"] = Field(
        "auto", description="continuing from a fine-tuned classifier (config with id2label): auto = head rows mapped "
        "by label name (new labels get fresh rows; no common name = a fresh head); always = rows by position; "
        "never = a fresh head"
    )
    freeze: list[str] = Field(
        default_factory=list, description="parameters to freeze (no gradient, no optimizer state): patterns over "
        "parameter names, e.g. [embeddings, encoder.layer.0-3, model.layers.0-5]; a range a.b.0-3 expands to layers "
        "0..3, * matches within one name part, embeddings = the input embeddings; see docs/lora-and-freezing.md"
    )
    pooling: Literal["auto", "pooler", "cls", "reinit"] = Field(
        "auto", description="sequence classification / regression / multi-label on a BERT-style model: what the head "
        "reads. pooler = the checkpoint's pooler; reinit = the pooler re-initialised (fresh, from train.seed); cls = "
        "the pooler set to the identity (tanh of the first token); auto = pooler, logging whether it looks untrained "
        "(the packaged MiniLM's does; re-initialising it measured worse). The saved model loads as a plain "
        "transformers model"
    )

    @field_validator("task")
    @classmethod
    def _known_task(cls, v: str) -> str:
        names = ["auto", *task_names()]
        if v not in names:
            raise ValueError("expected " + ", ".join(f"'{n}'" for n in names[:-1]) + f" or '{names[-1]}'")
        return v


class DataConfig(Section):
    """Where the data is, which columns hold texts, images, audio and labels, and how examples become batches."""

    train: str | None = Field(
        None, description="CSV/TSV/JSON/JSONL/Parquet file, save_to_disk folder, or Hub name; unset = built-in demo"
    )
    eval: str | None = Field(None, description="eval data, same forms; unset = a seeded hold-out of train")
    train_split: str = Field("train", description="split to train on when data.train is a multi-split dataset")
    eval_split: str | None = Field(None, description="split to evaluate on (default: validation, then test)")
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="hold-out fraction when no eval data is given")
    text_column: str | None = Field(None, description="auto: sentence, text, sentence1, ...")
    text_pair_column: str | None = Field(None, description="second text of a pair; auto: sentence2, ...")
    label_column: str | list[str] | None = Field(
        None, description="auto: label, labels; multi-label: a list of 0/1 columns, one per label, e.g. [toxic, "
        "insult, threat] (the column names become the label names)"
    )
    label_order: Literal["sorted", "first_seen"] = Field(
        "sorted", description="how string labels map to ids"
    )
    label_names: list[str] | None = Field(None, description="names for integer labels 0..K-1 (id order)")
    label_separator: str | None = Field(
        None, description="multi-label: labels given as one string per row, split at this separator (e.g. ','); "
        "unset = labels are lists (JSON/JSONL)"
    )
    tokens_column: str | None = Field(
        None, description="token classification: the column of word lists; auto: tokens, words (the tags: "
        "data.label_column, auto: ner_tags, tags, labels)"
    )
    label_all_tokens: bool = Field(
        False, description="token classification: every sub-token of a word carries the word's tag in the loss; "
        "false = the first sub-token only (the rest are ignored)"
    )
    max_length: int = Field(128, gt=0, description="tokens per example; longer inputs are truncated")
    standardize_targets: bool = Field(
        False, description="regression: train on (score - mean) / std, mean and std of the training split; stored "
        "in the model's config.json (target_standardization) so that predict and eval give the data's scale "
        "(pipeline() gives the standardised score)"
    )
    image_column: str | None = Field(
        None, description="images: column of image file paths (relative to the data file); auto: image, path, file, ..."
    )
    audio_column: str | None = Field(
        None, description="audio: column of audio file paths (relative to the data file); auto: audio, path, file, ..."
    )
    augment: bool = Field(
        False, description="images: light training augmentation on the fly (random resized crop, horizontal flip)"
    )
    max_seconds: float | None = Field(30.0, gt=0, description="audio: clips are cut to this length; null = no cap")
    batching: Literal["grouped", "dynamic", "padded"] = Field(
        "grouped", description="grouped: length-grouped, padded per batch; dynamic: shuffled, padded per batch; "
        "padded: shuffled, padded to max_length"
    )
    group_size: int = Field(50, gt=0, description="length grouping: mega-batch size in global batches")
    drop_last: bool = Field(False, description="drop a final global batch smaller than train.batch_size")
    max_train_samples: int | None = Field(None, gt=0, description="take the first N training rows (smoke runs)")
    max_eval_samples: int | None = Field(None, gt=0, description="take the first N eval rows")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes")
    quoting: Literal["auto", "none", "standard"] = Field(
        "auto", description="CSV/TSV quote characters. auto: standard CSV quoting (\"a, b\", \"\" for a quote), "
        "but a quoted field holding the delimiter and a line break (a stray quote merging rows) is refused with its "
        "lines; none: quote characters are plain text (e.g. a TSV with stray quotes); standard: quoting as in auto, "
        "and such fields are accepted"
    )
    template: str = Field(
        "auto", description="instruction/chat data: auto (the tokenizer's chat template when it has one, else the plain "
        "template; prompt/completion rows joined as they are), chat, plain, or a template string with {prompt} and "
        "ending in {response} ({system} optional); see docs/instruction-tuning.md"
    )
    train_on_prompt: bool = Field(
        False, description="instruction/chat data: false = loss on the assistant/response tokens only; true = every token"
    )
    packing: bool | Literal["auto"] = Field(
        "auto", description="instruction/chat data: several examples per data.block_size block, positions restarting "
        "per example (no attention across examples); auto = on (per-example losses are unchanged, see "
        "docs/instruction-tuning.md)"
    )
    cache_dir: str | None = Field(
        None, description="where datasets keeps its Arrow copies of the data files and the processed (tokenised) "
        "caches; unset = $HF_DATASETS_CACHE, else ~/.cache/huggingface/datasets (see docs/caches.md)"
    )
    block_size: int = Field(
        512, gt=1, description="causal LM: tokens per training block, cut from the token stream of all documents "
        "(packed across documents; the short tail is dropped)"
    )
    document_separator: str | None = Field(
        None, description="causal LM, .txt sources: split each file into documents at this string (e.g. '\\n\\n' "
        "for blank lines); unset = one document per file"
    )
    document_mask: bool = Field(
        False, description="causal LM: positions restart at each document inside a block and attention does not "
        "cross documents; a document's first token gets no target from the previous one"
    )
    num_proc: int | None = Field(
        None, gt=0, description="causal LM: processes that tokenise the corpus into token shards; unset = one per "
        "CPU but one, at most 8, for corpora over 16 MB, else 1 (in-process)"
    )

    @field_validator("label_column")
    @classmethod
    def _label_columns(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("expected a column name or a list of 0/1 columns, e.g. [toxic, insult]")
            twice = sorted(c for c in set(v) if v.count(c) > 1)
            if twice:
                raise ValueError(f"column {twice[0]!r} is listed twice")
        return v


class TrainConfig(Section):
    """How long and how big: epochs or steps, the global batch and its micro-batches, learning rate, cadences."""

    epochs: float = Field(3.0, gt=0, description="passes over the training data (ignored when max_steps > 0)")
    max_steps: int = Field(0, ge=0, description="optimizer steps; > 0 overrides epochs")
    batch_size: int = Field(32, gt=0, description="global batch: examples per optimizer step over all processes")
    micro_batch_size: int | str | None = Field(
        None, description="examples per process per forward pass; unset = batch_size / processes; "
        "auto = the largest that fits efficiency.memory_budget (accumulation makes up the rest)"
    )
    eval_batch_size: int | None = Field(None, gt=0, description="per process; unset = 2 x micro batch")

    @field_validator("micro_batch_size", mode="before")
    @classmethod
    def _micro(cls, v: Any) -> Any:
        if v is None or v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ValueError("expected a positive integer or 'auto'")
        return v
    lr: float = Field(5e-5, gt=0, description="peak learning rate")
    max_grad_norm: float | None = Field(1.0, gt=0, description="gradient clipping; null = off")
    seed: int = Field(
        42, ge=0, lt=2**32,
        description="seeds the data order, the hold-out split, a new head's weights, augmentation and dropout "
                    "(0 .. 2**32-1)",
    )
    eval_every_steps: int = Field(
        0, ge=0, description="evaluate every N optimizer steps; 0 = at the end of each epoch (and of training)"
    )
    log_every_steps: int = Field(10, gt=0, description="log loss/lr/throughput every N optimizer steps")
    stop_when: str | None = Field(
        None, description="stop at the first evaluation meeting it, e.g. 'eval.accuracy>=0.85' (time to accuracy)"
    )
    warmup_steps_excluded: int = Field(
        3, ge=0, description="first optimizer steps left out of samples/s and tokens/s (compile, allocator warm-up)"
    )
    early_stopping_patience: int = Field(
        0, ge=0, description="stop after N evaluations without improvement of checkpoint.best_metric; 0 = off"
    )
    nonfinite: Literal["abort", "skip_step"] = Field(
        "abort", description="on a NaN/Inf loss or grad norm: abort (stop with a diagnostic; checked on logging "
        "steps and before each checkpoint) or skip_step (skip that update; one host sync per step)"
    )
    class_weights: Literal["balanced"] | list[float] | None = Field(
        None, description="single-label classification: per-class loss weights; unset = none; balanced = n_samples "
        "/ (n_classes x count of the class) over the training data (sklearn's); or [w0, w1, ...], one positive weight "
        "per class in label-id order. The loss is divided by the sum of the weights of the global batch's examples"
    )
    pos_weight: Literal["balanced"] | float | list[float] | None = Field(
        None, description="multi-label: weight of the positive term of each label's binary cross-entropy (torch's "
        "BCEWithLogitsLoss pos_weight); unset = 1; a number for every label; [w0, w1, ...] one per label in label "
        "order; balanced = negatives / positives of each label in the training data. The loss stays divided by "
        "examples x labels of the global batch"
    )

    loss: Literal["mse", "huber"] = Field(
        "mse", description="regression: mse (squared error) or huber (squared within train.huber_delta, linear "
        "beyond; less pulled by outliers); summed over the examples / the global batch's example count"
    )
    huber_delta: float = Field(
        1.0, gt=0, description="train.loss=huber: where the loss turns from squared to linear, in the units the model "
        "predicts (the standardised scale under data.standardize_targets)"
    )

    @field_validator("class_weights")
    @classmethod
    def _class_weights(cls, v: Any) -> Any:
        if isinstance(v, list):
            if not v:
                raise ValueError("expected 'balanced' or one weight per class, e.g. [1.0, 3.0]")
            bad = [w for w in v if not (math.isfinite(w) and 0 < w <= MAX_MAGNITUDE)]
            if bad:
                raise ValueError(f"each weight must be a positive finite number (got {bad[0]!r})")
        return v

    @field_validator("pos_weight")
    @classmethod
    def _pos_weight(cls, v: Any) -> Any:
        values = v if isinstance(v, list) else [v] if isinstance(v, (int, float)) else []
        if isinstance(v, list) and not v:
            raise ValueError("expected 'balanced', a number, or one weight per label, e.g. [1.0, 3.0]")
        bad = [w for w in values if not (math.isfinite(w) and 0 < w <= MAX_MAGNITUDE)]
        if bad:
            raise ValueError(f"each weight must be a positive finite number (got {bad[0]!r})")
        return v


    @field_validator("stop_when")
    @classmethod
    def _stop_when(cls, v: str | None) -> str | None:
        if v is not None:
            check_metric(parse_stop_when(v)[0])
        return v


def check_metric(name: str, num_labels: int | None = None, task: str | None = None) -> None:
    """ValueError unless evaluation reports metric ``name`` (for ``task``, any when unset, with ``num_labels``
    classes), with did-you-mean."""
    import difflib

    task = task if task in SPECS else None  # auto, unresolved: any task's
    names = metric_names(num_labels, task)
    if name in names:
        return
    if name in metric_names(None, task):
        raise ValueError(f"eval.{name} is reported for 2 classes only; this data has {num_labels}: use one of "
                         + ", ".join(f"eval.{n}" for n in names))
    close = [n for n in names if n.startswith(name)] or difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" — did you mean eval.{close[0]}?" if close else ""
    raise ValueError(f"evaluation reports no metric {name!r}; it reports "
                     + ", ".join(f"eval.{n}" for n in names) + hint)


def parse_stop_when(text: str) -> tuple[str, str, float]:
    """'eval.accuracy>=0.85' -> ('accuracy', '>=', 0.85)."""
    import re

    m = re.fullmatch(r"\s*eval\.(\w+)\s*(>=|<=)\s*([-+0-9.eE]+)\s*", text)
    if not m:
        raise ValueError(f"expected eval.<metric> >= or <= a number, e.g. 'eval.accuracy>=0.85' (got {text!r})")
    return m.group(1), m.group(2), float(m.group(3))


class OptimConfig(Section):
    """The optimizer (one key switches it), weight decay, and the learning-rate schedule."""

    name: Literal["adamw", "adafactor", "adamw8bit", "sgd", "lion", "muon"] = Field(
        "adamw", description="adamw (torch, fused/foreach), adafactor (transformers), adamw8bit (bitsandbytes, "
        "extra leantrain[8bit]), sgd, lion (extra leantrain[lion]), muon (torch Muon for hidden 2-D weights + AdamW "
        "for the rest)"
    )
    weight_decay: float = Field(0.01, ge=0, description="decoupled weight decay (biases and norm weights excluded)")
    decay_norms_and_biases: bool = Field(
        False, description="also decay biases and LayerNorm/RMSNorm weights (parameters with ndim < 2)"
    )
    betas: tuple[float, float] | None = Field(
        None, description="unset = the optimizer's default: AdamW/8-bit/Muon's AdamW (0.9, 0.999), Lion (0.9, 0.99)"
    )
    eps: float = Field(1e-8, gt=0, description="AdamW / 8-bit AdamW epsilon")
    momentum: float | None = Field(
        None, ge=0, lt=1, description="sgd and muon momentum; unset = 0.9 for sgd, 0.95 for muon"
    )
    nesterov: bool | None = Field(None, description="Nesterov momentum for sgd and muon; unset = off for sgd, on for muon")
    adafactor_relative_step: bool = Field(
        False, description="Adafactor's own time-dependent step size: train.lr and optim.scheduler are then ignored"
    )
    scheduler: Literal["linear", "cosine", "constant", "inverse_sqrt"] = Field(
        "linear", description="learning-rate schedule after warm-up; stepped once per optimizer step"
    )
    warmup_ratio: float = Field(0.06, ge=0, lt=1, description="share of the steps spent warming up")
    warmup_steps: int | None = Field(None, ge=0, description="overrides warmup_ratio when set")


class CheckpointConfig(Section):
    """Resumable checkpoints, auto-resume, and the best model."""

    every_steps: int = Field(500, ge=0, description="save a resumable checkpoint every N optimizer steps; 0 = never")
    keep: int = Field(3, ge=1, description="newest complete checkpoints kept in output_dir/checkpoints/")
    keep_final: int = Field(
        1, ge=0, description="checkpoints kept once the run has finished (model/ and summary.json written); the log "
        "and summary.json say what was removed"
    )
    resume: str = Field(
        "auto", description="auto: continue from the last complete checkpoint in output_dir (same config); "
        "never: start afresh (old checkpoints are removed); or a checkpoint folder"
    )
    best_metric: str | None = Field(
        None, description="eval metric that picks output_dir/best/, e.g. eval.f1_macro, eval.loss; unset = no best/"
    )
    best_mode: Literal["auto", "max", "min"] = Field("auto", description="auto: min for eval.loss, else max")
    save_model: Literal["last", "best"] = Field("last", description="what output_dir/model/ holds")
    allow_inexact_resume: bool = Field(
        False, description="resume although the world size, global batch, data or RNG state differ (with a warning)"
    )

    @field_validator("best_metric")
    @classmethod
    def _known_metric(cls, v: str | None) -> str | None:
        names = [f"eval.{n}" for n in metric_names()]
        if v is not None and v not in names:
            raise ValueError(f"must be one of {', '.join(names)}")
        return v

class EfficiencyConfig(Section):
    """Switches that change speed and memory but not the result: precision, checkpointing, compile, fast paths."""

    precision: Literal["auto", "fp32", "bf16", "fp16", "fp8"] = Field(
        "auto", description="auto: bf16 where the CPU/GPU runs it natively, fp16 + grad scaler on older GPUs, "
        "else fp32; fp16/fp8 need a GPU"
    )
    gradient_checkpointing: bool = Field(
        False, description="recompute activations in backward (less memory, ~25-30% more time)"
    )
    compile: bool = Field(False, description="torch.compile the model (compile time is reported separately)")
    dropout: Literal["auto", "fast", "torch"] = Field(
        "auto", description="fast: nn.Dropout masks drawn 4 elements per random word, p rounded to 1/65536 "
        "(about half the cost of torch's on CPU); auto: fast on CPU, torch on GPUs"
    )
    chunked_loss: Literal["auto"] | bool = Field(
        "auto", description="causal LMs: the loss computed against the output layer a chunk of tokens at a time, so "
        "the fp32 tokens x vocab logits never exist (same loss and gradients, one more output-layer matmul); auto: "
        "on for a vocabulary of 8192 or more; true on a model that post-processes its logits fails (exit 2)"
    )
    cpu_allocator: Literal["auto", "reuse", "system"] = Field(
        "auto", description="reuse: freed host memory stays in the process for the next step instead of being "
        "unmapped and page-faulted in again (glibc), and the previous settings are restored at the end; system: "
        "leave the allocator alone; auto: reuse on CPU training (where it was measured to help), system on GPUs"
    )
    memory_budget: int | str | None = Field(
        None, description="bytes (or '4GiB', '500MB') per process for train.micro_batch_size=auto; "
        "unset = device memory on GPU, a safe share of available RAM on CPU"
    )
    profile: bool = Field(False, description="torch profiler trace + a table of where the step's time goes "
                          "(output_dir/profile/)")
    profile_steps: int = Field(10, gt=0, description="optimizer steps profiled (after 3 skipped and 1 warm-up)")


class ReportConfig(Section):
    """What the run reports besides metrics.jsonl and summary.json: trackers, progress, plots."""

    trackers: list[Literal["tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive"]] = Field(
        default_factory=list, description="Accelerate trackers, e.g. [tensorboard]; none by default"
    )
    progress: Literal["auto", "bar", "plain", "none"] = Field(
        "auto", description="auto: a bar on a terminal, plain log lines otherwise"
    )
    plots: bool = Field(True, description="write output_dir/loss_curve.png at the end")
    sample_prompts: list[str] = Field(
        default_factory=list, description="causal LM: prompts whose greedy continuations are written to metrics.jsonl "
        "and the log before training and at each evaluation, e.g. [\"Once upon a time\"]"
    )
    sample_max_new_tokens: int = Field(40, gt=0, le=4096, description="tokens generated per sample prompt")

    @field_validator("trackers")
    @classmethod
    def _installed(cls, v: list[str]) -> list[str]:
        """A tracker whose package is missing would be dropped silently by Accelerate: refuse it here."""
        import importlib.util

        for name in v:
            packages = TRACKER_PACKAGES[name]
            if not any(importlib.util.find_spec(p) for p in packages):
                raise ValueError(f"tracker {name!r} needs the package {packages[0]!r}, which is not installed: "
                                 f"pip install {packages[0]}")
        return v


TRACKER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboardX"), "wandb": ("wandb",), "mlflow": ("mlflow",),
                    "comet_ml": ("comet_ml",), "aim": ("aim",), "clearml": ("clearml",), "dvclive": ("dvclive",)}


class DistributedConfig(Section):
    """Several processes or machines (started with --nproc / --nnodes, torchrun or accelerate launch)."""

    strategy: Literal["auto", "ddp", "fsdp", "deepspeed"] = Field(
        "auto", description="auto: DDP when there are several processes; fsdp: torch FSDP2 (fully_shard) "
        "parameter sharding; deepspeed: ZeRO from distributed.deepspeed_config (CUDA only)"
    )
    deepspeed_config: str | None = Field(None, description="path to a DeepSpeed ZeRO JSON config")
    local_sgd_steps: int = Field(
        0, ge=0, description="K > 1: each process steps alone and parameters are averaged every K steps (local SGD)"
    )
    timeout_seconds: int = Field(300, gt=0, description="process-group timeout: a hung collective fails after this")


class EvalConfig(Section):
    """How evaluation and predictions read the model's outputs (the metrics themselves are ``eval.<metric>``)."""

    threshold: float = Field(
        0.5, gt=0, lt=1, description="multi-label: a label is predicted when its sigmoid score is above this "
        "(eval.f1_micro, eval.f1_macro, eval.subset_accuracy and the labels leantrain predict writes)"
    )
    tag_scheme: Literal["auto", "IOB1", "IOB2", "IOE1", "IOE2", "IOBES", "BILOU"] = Field(
        "auto", description="token classification: the tagging scheme of the entity metrics (strict span "
        "matching); auto: BILOU or IOBES from the tag names, IOB1 when a gold entity starts with I-, else IOB2"
    )
    tune_threshold: bool = Field(
        True, description="multi-label: at each evaluation pick the one threshold (for all labels) that maximises "
        "micro-F1 on the eval data; the metrics are reported at it (eval.threshold holds it) and the saved model's "
        "config.json keeps it (threshold), which leantrain predict / eval then use unless eval.threshold is set. "
        "Setting eval.threshold alone turns tuning off"
    )


class PeftConfig(Section):
    """Parameter-efficient fine-tuning through the peft library (pip install 'leantrain[peft]')."""

    method: Literal["none", "lora", "qlora"] = Field(
        "none", description="lora: low-rank adapters on the target modules, the base frozen (the task's head stays "
        "trainable); qlora: LoRA over 4-bit base weights (bitsandbytes, CUDA)"
    )
    r: int = Field(16, gt=0, description="LoRA rank")
    alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator (the update is scaled by alpha / r)")
    dropout: float = Field(0.05, ge=0, lt=1, description="dropout on the LoRA branch's input")
    target_modules: Literal["auto"] | list[str] = Field(
        "auto", description="auto: the attention and MLP projections of the architecture's repeated blocks (their "
        "Linear modules, e.g. q_proj..down_proj for Llama, c_attn/c_proj/c_fc for GPT-2, query/key/value/dense for "
        "BERT; printed at the start); or a list of module names (peft's suffix match)"
    )
    merge: bool = Field(
        True, description="model/ holds the merged model (loads without peft); false = only output_dir/adapter/"
    )


class Config(Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    efficiency: EfficiencyConfig = Field(default_factory=EfficiencyConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    peft: PeftConfig = Field(default_factory=PeftConfig)
    output_dir: str | None = Field(None, description="run folder; unset = runs/<date-time>")

    @field_validator("output_dir")
    @classmethod
    def _nonempty(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v

    @model_validator(mode="after")
    def _batch_sizes_divide(self) -> "Config":
        t = self.train
        if isinstance(t.micro_batch_size, int) and t.batch_size % t.micro_batch_size:
            raise ValueError(
                f"train.batch_size={t.batch_size} is not a multiple of train.micro_batch_size={t.micro_batch_size}; "
                f"use a micro batch that divides it, e.g. {largest_divisor(t.batch_size, t.micro_batch_size)}"
            )
        d = self.distributed
        if d.strategy == "deepspeed" and not d.deepspeed_config:
            raise ValueError("distributed.strategy=deepspeed needs distributed.deepspeed_config=path/to/zero.json")
        if self.peft.method != "none" and d.strategy in ("fsdp", "deepspeed"):
            raise ValueError(f"peft.method={self.peft.method} with distributed.strategy={d.strategy} is not supported: "
                             "the adapters are a small share of the parameters, so sharding buys little, and merging "
                             "them into sharded weights at save time is not implemented; use DDP (the default)")
        if self.peft.method == "qlora":  # the device (CUDA only) is checked before any worker or model starts
            if self.model.config or self.model.config_type:
                raise ValueError("peft.method=qlora quantises pretrained weights; a model built from model.config / "
                                 "model.config_type has none (nothing to quantise): use peft.method=lora or train it "
                                 "in full")
            if self.efficiency.precision not in ("auto", "bf16"):
                raise ValueError(f"peft.method=qlora with efficiency.precision={self.efficiency.precision} is not "
                                 "supported: the 4-bit layers compute in bf16 (bnb_4bit_compute_dtype=bfloat16); "
                                 "use efficiency.precision=bf16 (or auto)")
        if d.local_sgd_steps > 1 and d.strategy in ("fsdp", "deepspeed"):
            raise ValueError(f"distributed.local_sgd_steps works with DDP only, not distributed.strategy={d.strategy}")
        return self

    @model_validator(mode="after")
    def _problem_type(self) -> "Config":
        check_problem_type(self.model.task, self.model.config_overrides)
        return self

    @model_validator(mode="after")
    def _best_metric_needed(self) -> "Config":
        if self.checkpoint.best_metric is None:
            if self.checkpoint.save_model == "best":
                raise ValueError("checkpoint.save_model=best needs checkpoint.best_metric, e.g. eval.f1_macro")
            if self.train.early_stopping_patience:
                raise ValueError("train.early_stopping_patience needs checkpoint.best_metric, e.g. eval.f1_macro")
        return self

    def to_dict(self) -> dict[str, Any]:
        return json.loads(self.model_dump_json())

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


def largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)
