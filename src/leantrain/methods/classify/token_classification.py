"""Token classification (``model.task=token-classification``; named entities): one tag per word, read from rows of
words and tags or a CoNLL file by the ``tagged`` data side (``leantrain.data.tagged``), aligned to
sub-tokens with the fast tokenizer's word ids. Cross-entropy in fp32 summed over the labelled sub-tokens (-100
ignored); the engine divides by the labelled sub-tokens of the global batch (``count``, from per-row counts made at processing time). Metrics: entity
precision / recall / F1 with seqeval's strict span matching (scheme: ``eval.tag_scheme``, auto from the tags),
token accuracy over the labelled words, loss; F1 per entity type in metrics.jsonl. The saved model loads with
``pipeline("token-classification", aggregation_strategy="simple")``; ``leantrain predict`` writes the entity spans
and the tag of every word."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F

from leantrain.config.tasks import TOKEN_CLASSIFICATION, task_spec
from leantrain.methods.registry import CardText, Task, register
from leantrain.methods.traits import Traits
from leantrain.methods.row_counts import RowCounts

IGNORE = -100  # sub-tokens without a label (leantrain.data.tagged: special tokens, later sub-tokens of a word)
SCHEMES = ("IOB1", "IOB2", "IOE1", "IOE2", "IOBES", "BILOU")


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy per sub-token (B, T) in fp32; 0 where the label is -100."""
    return F.cross_entropy(logits.float().transpose(1, 2), labels, ignore_index=IGNORE, reduction="none")


def word_starts(word_ids: np.ndarray) -> np.ndarray:
    """Which sub-tokens start a word (word id >= 0, unlike the one before)."""
    return (word_ids >= 0) & np.r_[True, word_ids[1:] != word_ids[:-1]]


def detect_scheme(tag_names: list[str], gold: list[list[str]] | None = None) -> str:
    """The tagging scheme: BILOU (L- / U- tags), IOBES (E- / S- tags), IOB1 (a gold entity that starts with I-:
    after O, at a sentence start or after another type), else IOB2."""
    prefixes = {t.split("-", 1)[0] for t in tag_names if "-" in t}
    if prefixes & {"L", "U"}:
        return "BILOU"
    if prefixes & {"E", "S"}:
        return "IOBES"
    for sent in gold or []:
        prev = "O"
        for tag in sent:
            if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
                return "IOB1"
            prev = tag
    return "IOB2"


def sentences(values: dict[str, np.ndarray], tag_names: list[str]) -> tuple[list[list[str]], list[list[str]]]:
    """(gold, predicted) tag names per sentence from the flat per-word values (``first`` marks a sentence start)."""
    starts = np.flatnonzero(values["first"])
    bounds = list(starts[1:]) + [len(values["first"])]
    names = np.asarray(tag_names, dtype=object)
    gold = [list(names[values["labels"][a:b]]) for a, b in zip(starts, bounds)]
    pred = [list(names[values["preds"][a:b]]) for a, b in zip(starts, bounds)]
    return gold, pred


def entity_metrics(gold: list[list[str]], pred: list[list[str]], scheme: str = "auto",
                   tag_names: list[str] | None = None) -> tuple[dict, dict]:
    """(entity_precision / recall / f1 (seqeval, strict), {entity type: f1}) of tag-name sequences."""
    from seqeval import scheme as schemes
    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

    name = detect_scheme(tag_names or sorted({t for s in gold for t in s}), gold) if scheme == "auto" else scheme
    kw = {"mode": "strict", "scheme": getattr(schemes, name), "zero_division": 0}
    out = {"entity_precision": float(precision_score(gold, pred, **kw)),
           "entity_recall": float(recall_score(gold, pred, **kw)),
           "entity_f1": float(f1_score(gold, pred, **kw))}
    report = classification_report(gold, pred, output_dict=True, **kw)
    per_type = {k: float(v["f1-score"]) for k, v in report.items() if not k.endswith(" avg")}
    return out, per_type


class TokenClassificationStep(Task.parts.step):
    def loss_sum(self, outputs, batch: dict) -> torch.Tensor:
        return (token_losses(outputs.logits, batch["labels"]).sum(-1) * batch["loss_weight"]).sum()


class TokenClassificationModel(Task.parts.model):
    def calibration_labels(self, model, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(input_ids)  # a tag per sub-token


class TokenClassificationData(Task.parts.data):
    def __init__(self, task) -> None:  # noqa: ANN001 - the method
        super().__init__(task)
        self.counts = RowCounts()  # per-row counts of each dataset, read once

    def count(self, dataset, indices) -> int:
        """Labelled sub-tokens of the real examples of ``indices`` (padding indices are negative), from the per-row
        counts made at processing time (read from Arrow once per dataset, then numpy)."""
        return self.counts.total(dataset, "n_all" if self.task.all_tokens else "n_first", indices)


class TokenClassificationEvaluation(Task.parts.evaluation):
    def batch(self, logits: torch.Tensor, labels: torch.Tensor) -> dict:
        """Per labelled word (flat over the batch): gold and predicted tag ids, loss, and whether it starts its
        sentence."""
        mask = labels != IGNORE
        first = mask & (mask.long().cumsum(-1) == 1)
        return {"preds": logits.argmax(-1)[mask], "labels": labels[mask], "losses": token_losses(logits, labels)[mask],
                "first": first[mask]}

    def metrics(self, values: dict[str, np.ndarray], num_labels: int) -> dict:
        """Token accuracy and loss (entity metrics need the tag names: ``evaluation.all_metrics``)."""
        out = {"token_accuracy": float((values["preds"] == values["labels"]).mean()) if len(values["labels"]) else 0.0,
               "loss": float(values["losses"].mean()) if len(values["losses"]) else 0.0,
               "samples": int(values["first"].sum())}
        return out

    def all_metrics(self, values: dict[str, np.ndarray], label_names: list[str]) -> dict:
        gold, pred = sentences(values, label_names)
        ents, per_type = entity_metrics(gold, pred, self.task.scheme, label_names)
        base = self.metrics(values, len(label_names))
        return {**ents, **base, "f1_per_entity": per_type}

    def label_metrics(self, values: dict[str, np.ndarray], label_names: list[str]) -> dict:
        return {"f1_per_entity": entity_metrics(*sentences(values, label_names), self.task.scheme, label_names)[1]}

    def row_labels(self, rows, processed) -> torch.Tensor:
        """(rows, width) labels: each word's tag on its first sub-token, -100 elsewhere."""
        width = max(processed["length"]) if len(processed) else 0
        labels = np.full((len(processed), width), IGNORE, dtype=np.int64)
        for i, (ids, tags) in enumerate(zip(processed["word_ids"], processed["tags"])):
            ids = np.asarray(ids)
            first = np.flatnonzero(word_starts(ids))
            labels[i, first] = np.asarray(tags)[ids[first]]
        return torch.from_numpy(labels)

    def headline(self, ev: dict) -> str:
        return (f"eval entity F1: {ev['entity_f1']:.4f}  precision: {ev['entity_precision']:.4f}  "
                f"recall: {ev['entity_recall']:.4f}  token accuracy: {ev['token_accuracy']:.4f}")


class TokenClassificationPrediction(Task.parts.prediction):
    def records(self, logits: torch.Tensor, label_names: list[str]) -> list[dict]:
        raise NotImplementedError("token classification predicts per word: row_predictions")

    def rows(self, logits: torch.Tensor, label_names: list[str], rows, processed) -> list[dict]:
        """Per row: {"entities": [{"entity", "words", "start", "end" (word indices, end exclusive), "score" (the
        mean probability of the entity's words' tags)}], "tags": [tag per word]}; words cut off by data.max_length
        are tagged O."""
        from seqeval.metrics.sequence_labeling import get_entities

        probs = torch.softmax(logits.float(), dim=-1)
        out = []
        for i, (words, ids) in enumerate(zip(rows["tokens"], processed["word_ids"])):
            ids_arr = np.asarray(ids)
            first = np.flatnonzero(word_starts(ids_arr))
            tags = ["O"] * len(words)
            scores = [1.0] * len(words)
            p, k = probs[i, first].max(-1)
            for pos, word in enumerate(ids_arr[first].tolist()):
                tags[word], scores[word] = label_names[int(k[pos])], float(p[pos])
            entities = []
            for kind, start, last in get_entities(tags):
                entities.append({"entity": kind, "words": " ".join(words[start:last + 1]), "start": start,
                                 "end": last + 1, "score": round(float(np.mean(scores[start:last + 1])), 6)})
            out.append({"entities": entities, "tags": tags})
        return out


@dataclasses.dataclass(frozen=True)
class TokenClassification(Task):
    """One tag per word; the loss over the labelled sub-tokens."""

    all_tokens: bool = False  # data.label_all_tokens: every sub-token of a word counts (training)
    scheme: str = "auto"  # eval.tag_scheme

    parts = dataclasses.replace(Task.parts, step=TokenClassificationStep, model=TokenClassificationModel,
                                data=TokenClassificationData, evaluation=TokenClassificationEvaluation,
                                prediction=TokenClassificationPrediction)

    def configured(self, cfg, model_config=None) -> "TokenClassification":
        return dataclasses.replace(self, all_tokens=cfg.data.label_all_tokens, scheme=cfg.eval.tag_scheme)





TOKEN_CLASSIFICATION_TASK = register(TokenClassification(
    task_spec(TOKEN_CLASSIFICATION),
    # counts tokens, but no language model: samples/s, eval rows are sentences (issue 32: not "blocks")
    Traits(labels="tags", unit="tokens", auto_model="AutoModelForTokenClassification",
           loads_as="token-classification", model_mapping="MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    CardText("token classification (named entities)", "token classifier",
             '"Angela Merkel visited Paris.", aggregation_strategy="simple"')))
