"""What a task is, declared once (``Traits``): what its rows are labelled with, what its loss counts, what its speed
and its eval rows are counted in, what the saved model loads as, what its inputs are. The engine, the commands and
the reports read ``task.traits.<name>`` instead of comparing a task's names or guessing from one field what it is
(a token classifier counts tokens too, but it is no language model: its speed is in samples, its eval rows are
examples). Each task module declares its record with ``register``; a configured task may replace a field that
follows the run's settings (``keeps_dropout``: ``preference.dropout``)."""

from __future__ import annotations

from dataclasses import dataclass

from leantrain.modeling.fast_paths import FORWARD_PATHS

# the data side's label kinds (auto reads them); prompts: prompts to be answered, no label (GRPO)
LABELS = ("classes", "scores", "label_sets", "tags", "none", "pairs", "prompts")
ROW_LABELS = ("classes", "scores", "label_sets", "tags")  # labels a row's prediction is compared with
UNITS = ("examples", "labels", "tokens", "pairs")
PROCESSORS = ("tokenizer", "image_processor", "feature_extractor")
SPEED_UNITS = ("samples", "tokens")
EVAL_ROW_KINDS = ("examples", "blocks")


@dataclass(frozen=True)
class Traits:
    """One task's declared traits; the yes/no questions the rest of leantrain asks are its properties."""

    labels: str  # what a row is labelled with, as the data side reads it: LABELS ("none": a language model's text)
    unit: str  # what ``step.loss_sum`` sums over and ``count`` counts: UNITS
    auto_model: str  # the transformers Auto class the model is built and saved as
    loads_as: str  # the ``pipeline()`` task of the saved model (the card's pipeline_tag)
    processor: str = "tokenizer"  # what turns its inputs into model inputs: PROCESSORS
    speed_unit: str = "samples"  # what its speed is counted in: "tokens" (a language model's tokens/s) or "samples"
    eval_row_kind: str = "examples"  # one eval row: "examples", or "blocks" (token blocks cut from text)
    token_blocks: bool = False  # rows cut at data.block_size tokens (language models, pairs), bounded by the positions
    headline_loss: bool = False  # its ``headline`` says the eval loss itself (the final line does not add it)
    keeps_dropout: bool = True  # False: every nn.Dropout at p = 0 while training (preference.dropout=off)
    # every token of a row gets the same incoming gradient from the loss (the row's loss_weight): what Liger's fused
    # cross-entropy needs (efficiency.chunked_loss=auto: leantrain.modeling.output_loss); preference losses do not
    uniform_token_gradients: bool = True
    scratch_needs_tokenizer: bool = False  # a model from a config needs model.tokenizer (causal LM), not model.name's
    # what the progress line shows at a logging step before lr and speed: the loss and step metrics (``Task.step.loss``)
    progress_keys: tuple[str, ...] = ("loss",)
    model_mapping: str | None = None  # the modeling_auto mapping of model types it takes (model.task=auto), or None
    default_for: tuple[str, ...] = ()  # modalities whose data picks it under model.task=auto
    head_lr_factor: float = 1.0  # the classifier head's peak lr / train.lr when train.head_lr is unset (head_start)
    untrained_pooler: str = "pooler"  # what model.pooling=auto does with an untrained-looking BERT pooler (pooling)
    # the fast paths of the model's forward its step or evaluation may take (``modeling/fast_paths.py``: decode_step,
    # shared_prompts, first_token): the run's connector decides each of them (engine/devices/paths.py), no other
    forward_paths: tuple[str, ...] = ()

    @property
    def labelled(self) -> bool:
        """Its data has labels (a language model's text has none: ``leantrain eval`` reports loss and perplexity)."""
        return self.labels != "none"

    @property
    def class_labels(self) -> bool:
        """Its labels are classes (per-class metrics, a confusion matrix)."""
        return self.labels == "classes"

    @property
    def score_labels(self) -> bool:
        """Its labels are scores (regression: train.loss=huber, data.standardize_targets)."""
        return self.labels == "scores"

    @property
    def paired(self) -> bool:
        """Its rows are chosen / rejected pairs or rated completions (preference tuning, reward models): the
        preference.* keys, and ``leantrain eval`` reports the task's pair metrics."""
        return self.labels == "pairs"

    @property
    def evaluated_by_rows(self) -> bool:
        """``leantrain eval`` scores it from each row's prediction, in the rows' order (per-class values and a
        confusion matrix for classes): its rows carry labels to compare with. Otherwise as a training run's
        evaluation does (a language model's loss and perplexity, the metrics of a paired task, the rewards of the
        completions a method generates from prompts)."""
        return self.labels in ROW_LABELS

    @property
    def tokenized(self) -> bool:
        """Its inputs are text through the model's tokenizer (a pad token, a position limit in tokens)."""
        return self.processor == "tokenizer"

    @property
    def media_inputs(self) -> bool:
        """Its inputs are files (images, audio) in the ``modality`` column: a prediction names its file."""
        return not self.tokenized

    @property
    def generates(self) -> bool:
        """Its saved model is a text generator (``pipeline("text-generation")``): sample continuations, the card."""
        return self.loads_as == "text-generation"

    @property
    def sequence_classifier(self) -> bool:
        """Its model is an ``AutoModelForSequenceClassification`` (a pooler: ``model.pooling``)."""
        return self.auto_model == "AutoModelForSequenceClassification"

    def problems(self) -> list[str]:
        """What contradicts itself in this record (empty when it is consistent): each field among its choices, a
        speed in tokens only for a language model (text cut into blocks, no labels) or a method that generates from
        prompts, eval rows of token blocks only for a language model."""
        out = [f"{name}={value!r} is not one of {choices}" for name, value, choices in (
            ("labels", self.labels, LABELS), ("unit", self.unit, UNITS), ("processor", self.processor, PROCESSORS),
            ("speed_unit", self.speed_unit, SPEED_UNITS), ("eval_row_kind", self.eval_row_kind, EVAL_ROW_KINDS))
            if value not in choices]
        language_model = self.token_blocks and not self.labelled
        online = self.token_blocks and self.labels == "prompts"  # it generates the tokens it trains on (GRPO)
        if (self.speed_unit == "tokens") != (language_model or online):
            out.append(f"speed_unit={self.speed_unit!r}: tokens/s is the speed of a language model or of a method "
                       "that generates from prompts")
        if (self.eval_row_kind == "blocks") != language_model:
            out.append(f"eval_row_kind={self.eval_row_kind!r}: eval rows are blocks for a language model only")
        if self.paired != (self.unit == "pairs"):
            out.append(f"unit={self.unit!r} with labels={self.labels!r}: a paired task counts pairs")
        if self.generates != self.auto_model.endswith("CausalLM"):
            out.append(f"loads_as={self.loads_as!r} with {self.auto_model}: a text generator is a causal LM")
        if self.scratch_needs_tokenizer and not self.generates:
            out.append("scratch_needs_tokenizer: only a causal LM takes its vocabulary from model.tokenizer")
        out += [f"forward_paths: {p!r} is not one of {FORWARD_PATHS}" for p in self.forward_paths
                if p not in FORWARD_PATHS]
        return out
