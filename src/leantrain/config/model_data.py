"""The model and data sections: which model to train for which task, and where the data is and how it is batched."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from leantrain.config.base import Section
from leantrain.config.tasks import task_names


ESCAPES = {"\\n": "\n", "\\t": "\t", "\\r": "\r"}


def unescape_text(value: Any) -> Any:
    """A text key's ``\\n``, ``\\t``, ``\\r`` (as a command line or a single-quoted YAML string writes them) mean
    the characters, the same for every such key (data.template, data.document_separator)."""
    if not isinstance(value, str) or "\\" not in value:
        return value
    for escaped, char in ESCAPES.items():
        value = value.replace(escaped, char)
    return value


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
        "the pooler set to the identity (tanh of the first token); auto = the pooler unless it looks untrained (the "
        "packaged MiniLM's does): then cls for multi-label, kept for the other tasks (logged). The saved model loads "
        "as a plain transformers model"
    )
    save_dtype: Literal["auto", "float32"] = Field(
        "auto", description="dtype of the saved model/ (training keeps fp32 weights either way): auto = the "
        "checkpoint's (bf16 for SmolLM2: half the size on disk; float32 for an fp32 checkpoint or a model built from a "
        "config; QLoRA's merge: bf16, the precision of its reloaded base); float32 = the trained fp32 weights"
    )

    attn_implementation: Literal["auto", "sdpa", "eager", "flash_attention_2"] = Field(
        "auto", description="transformers' attention implementation: auto = flash_attention_2 on CUDA in bf16/fp16 "
        "where the flash_attn package is installed and the model supports it (not with report.sample_prompts or a "
        "merged LoRA, whose passes run the fp32 model outside autocast); on the CPU in bf16/fp16, leantrain_sdpa "
        "(SDPA whose backward of short rows is computed with matmuls in fp32: the CPU flash backward is slow there); "
        "else sdpa (PyTorch's fused attention, transformers' default) where the model has it, else eager; the log "
        "says why. An explicit value the model, "
        "device or precision cannot run exits 2"
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
    train_on_empty_think: bool = Field(
        False, description="instruction/chat and preference data: false = an empty <think></think> block in a reply "
        "(whitespace only inside, as Qwen3-style chat templates insert before every reply) is not learnt, so the "
        "model is not taught to skip its reasoning; true = learn it like the rest of the reply (data.train_on_prompt="
        "true learns every token anyway)"
    )
    system_prompt: str | None = Field(
        None, description="instruction/chat data: the system message of every conversation without one (a row's "
        "own system turn or `system` column wins); unset = none, so a chat template with a default system prompt "
        "(SmolLM2's) writes its own"
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
    max_prompt_length: int | None = Field(
        None, gt=0, description="preference data: a prompt longer than this many tokens keeps its end (its last "
        "tokens); unset = half of data.block_size; the response fills the rest of data.block_size"
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

    @field_validator("template", "document_separator")
    @classmethod
    def _escapes(cls, v: Any) -> Any:
        return unescape_text(v)

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
