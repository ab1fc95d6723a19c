"""What a new user tripped on (issue 18, items 2-5 and 7): trackers, problem_type, set-like labels, GPT-2 padding,
the packaged model's short name."""

import importlib.util
import json
import random

import pytest

from tests.helpers import write_rows
from leantrain.cli import main

WORDS = {"pos": ["great", "lovely", "superb", "fine"], "neg": ["awful", "bad", "broken", "poor"]}


def _rows(n, seed=0):
    r = random.Random(seed)
    out = []
    for _ in range(n):
        lab = r.choice(["pos", "neg"])
        out.append({"text": " ".join(r.choice(WORDS[lab]) for _ in range(r.randint(1, 8))), "label": lab})
    return out


# ------------------------------------------------------------------------------------------------ 2. trackers


@pytest.mark.parametrize("tracker,package", [("wandb", "wandb"), ("mlflow", "mlflow"), ("trackio", "trackio"),
                                             ("swanlab", "swanlab")])
def test_missing_tracker_package_is_exit_2(tracker, package, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    assert main(["train", "--print-config", f"report.trackers=[{tracker}]"]) == 2
    err = capsys.readouterr().err
    assert f"pip install {package}" in err and "report.trackers" in err


def test_tensorboard_tracker_still_accepted(capsys):
    if not (importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX")):
        pytest.skip("tensorboard not installed")
    assert main(["train", "--print-config", "report.trackers=[tensorboard]"]) == 0


# ------------------------------------------------------------------------------------------------ 3. problem_type


@pytest.mark.parametrize("value", ["regression", "multi_label_classification"])
def test_problem_type_contradicting_the_task_is_exit_2(value, capsys):
    assert main(["train", "--print-config", f"model.config_overrides.problem_type={value}"]) == 2
    assert "problem_type" in capsys.readouterr().err
    assert main(["train", "--print-config", "model.task=text-classification",
                 f"model.config_overrides.problem_type={value}"]) == 2


def test_problem_type_of_the_task_is_accepted():
    assert main(["train", "--print-config", "model.config_overrides.problem_type=single_label_classification"]) == 0


# ------------------------------------------------------------------------------------------------ 5. GPT-2 padding


def _gpt2_tokenizer(folder):
    """A tiny byte-level BPE saved as a GPT2TokenizerFast with no pad token (like GPT-2's own)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(w) for w in WORDS.values()], trainer)
    eos = "<|endoftext|>"
    fast = GPT2TokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=eos, unk_token=eos)
    assert fast.pad_token is None
    fast.save_pretrained(folder)
    return folder, len(fast)


def test_gpt2_from_config_trains_with_eos_as_pad(tmp_path, capsys):
    tok, vocab = _gpt2_tokenizer(tmp_path / "tok")
    train_f = write_rows(tmp_path / "train.csv", _rows(40))
    out = tmp_path / "run"
    rc = main(["train", "model.config_type=gpt2", f"model.name={tok}", f"model.config_overrides.vocab_size={vocab}",
               "model.config_overrides.n_layer=1", "model.config_overrides.n_embd=16",
               "model.config_overrides.n_head=2", "model.config_overrides.n_positions=64", f"data.train={train_f}",
               "data.max_length=32", "train.max_steps=2", "train.batch_size=8", "report.plots=false",
               "checkpoint.every_steps=0", f"output_dir={out}"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "EOS token" in err and "pad_token_id" in err
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(out / "model")
    assert saved.pad_token == "<|endoftext|>"
    assert json.loads((out / "model" / "config.json").read_text())["pad_token_id"] == saved.eos_token_id


# ------------------------------------------------------------------------------------------------ 7. short name


def test_short_name_resolves_to_packaged_model(minilm, tmp_path):
    from leantrain.modeling.names import PACKAGED_MODEL, display_name, resolve_model_name

    assert resolve_model_name("minilm") == minilm
    assert resolve_model_name(None) == minilm
    assert resolve_model_name("MiniLM") == minilm
    assert resolve_model_name("some/other-model") == "some/other-model"
    assert display_name("minilm") == PACKAGED_MODEL
    assert resolve_model_name(PACKAGED_MODEL, revision="abc") == PACKAGED_MODEL  # a pinned revision: the Hub


def test_hub_id_of_packaged_model_offline(minilm, monkeypatch):
    from huggingface_hub import constants

    from leantrain.modeling.names import PACKAGED_MODEL, resolve_model_name

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve_model_name(PACKAGED_MODEL) == minilm
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert resolve_model_name(PACKAGED_MODEL) == PACKAGED_MODEL


def test_inspect_without_argument_and_with_minilm(capsys):
    assert main(["inspect", "--json"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert main(["inspect", "minilm", "--json"]) == 0
    short = json.loads(capsys.readouterr().out)
    assert default["parameters"] == short["parameters"] and default["parameters"]["total"] > 20e6


# ------------------------------------------------------------------------------------------------ 4. set-like labels

EMOTIONS = ["anger", "disgust", "fear", "joy", "sadness", "surprise", "trust", "love", "optimism", "pessimism"]


def _joined_rows(n, seed=0):
    r = random.Random(seed)
    return [{"text": f"row {i} " + " ".join(r.choice(EMOTIONS) for _ in range(3)),
             "label": ",".join(sorted(r.sample(EMOTIONS, r.randint(1, 3))))} for i in range(n)]


def test_comma_joined_labels_warn_and_point_to_multilabel(tmp_path):
    from leantrain.config import DataConfig
    from leantrain.data.text_loader import load_and_validate

    f = write_rows(tmp_path / "train.csv", _joined_rows(200))
    data = load_and_validate(DataConfig(train=str(f)), seed=0, batch_size=8)
    warning = " ".join(data.warnings)
    assert "look like sets" in warning and "model.task=multi-label data.label_separator=," in warning


def test_plain_labels_with_a_comma_do_not_warn(tmp_path):
    from leantrain.config import DataConfig
    from leantrain.data.text_loader import load_and_validate

    rows = [{"text": f"t {i}", "label": lab} for i, lab in enumerate(["yes, sure", "no", "maybe"] * 10)]
    data = load_and_validate(DataConfig(train=str(write_rows(tmp_path / "t.csv", rows))), seed=0, batch_size=8)
    assert not any("look like sets" in w for w in data.warnings)


def test_unseen_label_listing_is_capped(tmp_path):
    from leantrain.config import DataConfig
    from leantrain.data.text_loader import load_and_validate
    from leantrain.errors import DataError

    train_f = write_rows(tmp_path / "train.csv", _joined_rows(300))
    seen = {r["label"] for r in _joined_rows(300)}
    unseen = [r for r in _joined_rows(400, seed=7) if r["label"] not in seen]
    assert len({r["label"] for r in unseen}) > 20
    eval_f = write_rows(tmp_path / "dev.csv", unseen)
    with pytest.raises(DataError) as e:
        load_and_validate(DataConfig(train=str(train_f), eval=str(eval_f)), seed=0, batch_size=8)
    text = str(e.value)
    assert "in all)" in text and "more labels like these" in text
    assert len(text) < 3000, len(text)


def test_version_flag_prints_the_package_version(capsys):
    from leantrain import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"leantrain {__version__}"
