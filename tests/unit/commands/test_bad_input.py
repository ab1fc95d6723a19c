"""Bad config, command lines and model folders that used to get through (issue 17, items 8, 11-16; issue 18,
item 14): each now stops before any work with exit status 2 and a message naming the key, option or value."""

from __future__ import annotations

import ctypes
import json
import time

import pytest

from tests.helpers import write_rows
from leantrain.cli import main
from leantrain.config import resolve
from leantrain.errors import ConfigError

WORDS = {"pos": ["great", "lovely", "superb"], "neg": ["awful", "bad", "poor"]}


@pytest.fixture
def train_csv(tmp_path):
    rows = [{"text": " ".join([WORDS[lab][i % 3]] * (1 + i % 5)), "label": lab}
            for i, lab in enumerate(["pos", "neg"] * 20)]
    return write_rows(tmp_path / "train.csv", rows)


def _err(capsys) -> str:
    return capsys.readouterr().err


# ------------------------------------------------------------------------------------------ item 12: numbers


@pytest.mark.parametrize("override, key", [
    ("train.lr=.inf", "train.lr"), ("train.epochs=1e400", "train.epochs"), ("train.lr=.nan", "train.lr"),
    ("train.epochs=1e300", "train.epochs"), ("optim.betas=[0.9, .inf]", "optim.betas"),
    ("train.max_grad_norm=-.inf", "train.max_grad_norm"), ("data.max_seconds=.inf", "data.max_seconds"),
    ("train.max_steps=1e30", "train.max_steps"), ("train.seed=-1", "train.seed"), ("train.seed=1e30", "train.seed"),
])
def test_non_finite_and_absurd_numbers_are_refused(override, key):
    with pytest.raises(ConfigError) as e:
        resolve(None, [override])
    assert e.value.problems and e.value.problems[0].startswith(f"{key}:"), str(e.value)


def test_inf_lr_exits_2_not_3(capsys):
    assert main(["train", "train.lr=.inf", "--print-config"]) == 2
    assert "train.lr: must be a finite number" in _err(capsys)


# ------------------------------------------------------------------------------------------ item 14: keys


def test_duplicate_yaml_key_names_key_and_both_lines(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 1.0e-4\n  epochs: 1\n  lr: 3.0e-5\n")
    with pytest.raises(ConfigError) as e:
        resolve(f)
    assert "key 'train.lr' is given twice, on lines 2 and 4" in str(e.value)
    f.write_text("train: {lr: 1.0e-4}\ndata: {train: a.csv}\ntrain: {epochs: 1}\n")
    with pytest.raises(ConfigError) as e:
        resolve(f)
    assert "key 'train' is given twice, on lines 1 and 3" in str(e.value)
    f.write_text("base: &b {lr: 1.0e-4}\ntrain:\n  <<: *b\n  epochs: 1\n")  # a merge key is not a duplicate
    with pytest.raises(ConfigError, match="unknown key 'base.lr'"):
        resolve(f)


@pytest.mark.parametrize("key, hint", [
    ("train.learning_rate", "'train.lr'"), ("learning_rate", "'train.lr'"), ("num_train_epochs", "'train.epochs'"),
    ("per_device_train_batch_size", "'train.micro_batch_size'"), ("train.warmup_ratio", "'optim.warmup_ratio'"),
    ("weight_decay", "'optim.weight_decay'"), ("max_seq_length", "'data.max_length'"), ("seed", "'train.seed'"),
    ("fp16", "efficiency.precision=fp16"), ("bf16", "efficiency.precision=bf16"),
    ("gradient_accumulation_steps", "in leantrain: train.batch_size (global) with train.micro_batch_size"),
    ("train.lrr", "'train.lr'"), ("trian.lr", "'train.lr'"), ("model.lora.r", "'peft.r'"),
])
def test_did_you_mean_knows_the_names_other_trainers_use(key, hint):
    with pytest.raises(ConfigError) as e:
        resolve(None, [f"{key}=1"])
    assert (hint if hint.startswith("in leantrain") else f"did you mean {hint}") in e.value.problems[0]


@pytest.mark.parametrize("key", ["model.adapters.rank", "train.foo", "quantization"])
def test_no_close_key_says_there_is_no_such_key(key):
    with pytest.raises(ConfigError) as e:
        resolve(None, [f"{key}=1"])
    (problem,) = e.value.problems
    assert "there is no such key" in problem and "docs/config.md" in problem and "did you mean" not in problem


# ------------------------------------------------------------------------------------------ item 11: stop_when


def test_stop_when_unknown_metric_is_refused_with_did_you_mean():
    with pytest.raises(ConfigError) as e:
        resolve(None, ["train.stop_when=eval.acc>=0.8"])
    assert "no metric 'acc'" in str(e.value) and "did you mean eval.accuracy" in str(e.value)


def test_stop_when_mcc_needs_two_classes():
    from leantrain.engine.setup.training_data import check_stop_when

    cfg = resolve(None, ["train.stop_when=eval.mcc>=0.5"])
    check_stop_when(cfg, 2)
    with pytest.raises(ConfigError, match="2 classes only; this data has 3"):
        check_stop_when(cfg, 3)


def test_metric_names_are_the_evaluators():
    import numpy as np

    from leantrain.methods.classify.classification import classification_metrics
    from leantrain.config.metric_names import metric_names

    for k in (2, 3):
        out = classification_metrics(np.array([0, 1, 1]), np.array([0, 1, 0]), np.ones(3), k)
        assert [m for m in out if m != "samples"] == metric_names(k, "text-classification")


# ------------------------------------------------------------------------------------------ item 8: max_length


def test_max_length_above_the_models_positions_exits_2_naming_both(tmp_path, tiny_bert, train_csv, capsys):
    rc = main(["train", f"model.name={tiny_bert}", f"data.train={train_csv}", "data.max_length=1024",
               "train.max_steps=1", f"output_dir={tmp_path / 'o'}"])
    err = _err(capsys)
    assert rc == 2 and "data.max_length=1024" in err and "max_position_embeddings=256" in err and "256" in err
    assert not (tmp_path / "o").exists()


def test_default_max_length_is_lowered_to_a_small_models_limit(capsys):
    from leantrain.engine.setup.preflight import check_max_length

    small = ['model.config_type=bert', 'model.config_overrides={max_position_embeddings: 64, hidden_size: 32, '
             'num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64}']
    assert check_max_length(resolve(None, small)).data.max_length == 64
    assert "the model's limit (max_position_embeddings=64)" in _err(capsys)
    with pytest.raises(ConfigError, match="data.max_length=100 is more than the model takes"):
        check_max_length(resolve(None, small + ["data.max_length=100"]))


def test_roberta_position_offset():
    from transformers import RobertaConfig

    from leantrain.modeling.positions import position_limit

    assert position_limit(RobertaConfig(max_position_embeddings=514, pad_token_id=1))[0] == 512


# ------------------------------------------------------------------------------------------ item 13: paths, launcher


def test_output_dir_that_is_a_file_exits_2(tmp_path, tiny_bert, train_csv, capsys):
    f = tmp_path / "taken"
    f.write_text("x")
    assert main(["train", f"model.name={tiny_bert}", f"data.train={train_csv}", "train.max_steps=1",
                 f"output_dir={f}"]) == 2
    assert f"output_dir={f}: {f} exists and is not a folder" in _err(capsys)


@pytest.mark.parametrize("where", ["/proc/leantrain-run", "/sys/leantrain/run"])
def test_output_dir_that_cannot_be_written_exits_2(where, tiny_bert, train_csv, capsys):
    assert main(["train", f"model.name={tiny_bert}", f"data.train={train_csv}", "train.max_steps=1",
                 f"output_dir={where}"]) == 2
    assert f"output_dir={where}: cannot write in" in _err(capsys)


def test_predict_and_eval_output_that_is_a_folder_exits_2(tmp_path, capsys):
    assert main(["predict", str(tmp_path), "--input", "x.csv", "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path}: is a folder" in _err(capsys)
    assert main(["eval", str(tmp_path), "data.eval=x.csv", "--output", str(tmp_path)]) == 2
    assert f"--output {tmp_path}: is a folder" in _err(capsys)


@pytest.fixture
def pickle_only_model(tmp_path, tiny_bert):
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(tiny_bert, num_labels=2, id2label={0: "neg", 1: "pos"},
                                                          label2id={"neg": 0, "pos": 1})
    out = tmp_path / "pickled"
    model.config.architectures = ["BertForSequenceClassification"]
    model.config.save_pretrained(out)
    torch.save(model.state_dict(), out / "pytorch_model.bin")  # written, never loaded
    AutoTokenizer.from_pretrained(tiny_bert).save_pretrained(out)
    assert (out / "pytorch_model.bin").is_file() and not list(out.glob("*.safetensors"))
    return out


def test_pickle_only_model_folder_in_predict_and_eval_exits_2(tmp_path, pickle_only_model, train_csv, capsys):
    assert main(["predict", str(pickle_only_model), "--input", str(train_csv),
                 "--output", str(tmp_path / "p.jsonl")]) == 2
    assert "only pickle weights (pytorch_model.bin)" in (err := _err(capsys)) and "model.allow_pickle=true" in err
    assert main(["eval", str(pickle_only_model), f"data.eval={train_csv}"]) == 2
    assert "only pickle weights" in _err(capsys)


def test_batch_not_divisible_by_nproc_exits_2_before_spawning(tmp_path, tiny_bert, train_csv, capsys, monkeypatch):
    import leantrain.launch.torchrun

    def spawned(*a, **k):
        raise AssertionError("workers were started")

    monkeypatch.setattr(leantrain.launch.torchrun, "launch", spawned)
    assert main(["train", "--nproc", "3", f"model.name={tiny_bert}", f"data.train={train_csv}", "train.batch_size=32",
                 f"output_dir={tmp_path / 'o'}"]) == 2
    assert "train.batch_size=32 does not divide over 3 processes" in _err(capsys)


# ------------------------------------------------------------------------------------------ item 15: model.name


def test_missing_local_model_path_is_reported_as_a_missing_folder(tmp_path, capsys):
    assert main(["train", f"model.name={tmp_path / 'no' / 'such'}", "--print-config"]) == 0  # config only
    for name in (str(tmp_path / "no" / "such"), "./runs/x/model", "../m"):
        assert main(["train", f"model.name={name}", f"output_dir={tmp_path / 'o'}"]) == 2
        err = _err(capsys)
        assert f"model.name={name}: no such folder" in err and "Hub" not in err


def test_unknown_hub_id_offline_fails_fast_naming_the_cache(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.monotonic()
    assert main(["train", "model.name=someone/no-such-model-xyz", f"output_dir={tmp_path / 'o'}"]) == 2
    assert time.monotonic() - t0 < 60  # generous: the point is no network retries
    assert "model.name=someone/no-such-model-xyz: not a local folder, and not in the Hugging Face cache" in _err(capsys)


def test_unknown_hub_id_online_is_one_short_request(monkeypatch):
    from leantrain.modeling import hubcheck

    class RepositoryNotFoundError(Exception):
        pass

    calls = []

    def probe(name, revision, timeout):
        calls.append(timeout)
        raise RepositoryNotFoundError("404")

    monkeypatch.setattr(hubcheck, "offline", lambda: False)
    monkeypatch.setattr(hubcheck, "probe", probe)
    with pytest.raises(ConfigError, match="no such model on the Hugging Face Hub"):
        hubcheck.check_model_name("someone/no-such-model-xyz")
    monkeypatch.setattr(hubcheck, "probe", lambda *a: (_ for _ in ()).throw(ConnectionError("unreachable")))
    with pytest.raises(ConfigError, match="could not be reached .*HF_HUB_OFFLINE=1"):
        hubcheck.check_model_name("someone/other-model")
    assert calls == [hubcheck.HUB_TIMEOUT]


# ------------------------------------------------------------------------------------------ item 16: allocator


class FakeLibc:
    def __init__(self):
        self.values: dict[int, int] = {}
        self.trims = 0

    def mallopt(self, key, value):
        self.values[key.value] = value.value
        return 1

    def malloc_trim(self, pad):
        self.trims += 1
        return 1


@pytest.fixture
def fake_libc(monkeypatch):
    from leantrain.engine.devices import host_allocator as hostmem

    libc = FakeLibc()
    monkeypatch.setattr(hostmem, "tunable_glibc", lambda: libc)
    return libc


def test_cpu_allocator_auto_applies_on_cpu_training_only(fake_libc):
    from leantrain.engine.devices.host_allocator import host_memory

    with host_memory("auto", "cuda") as applied:
        assert applied == "system" and fake_libc.values == {}
    with host_memory("auto", "cpu") as applied:
        assert applied == "reuse"
    assert resolve(None, []).efficiency.cpu_allocator == "auto"


def test_cpu_allocator_restores_the_previous_settings(fake_libc):
    from leantrain.engine.devices.host_allocator import GLIBC_DEFAULTS, REUSE, host_memory

    with host_memory("reuse", "cpu"):
        with host_memory("reuse", "cpu"):  # e.g. bench or a test running train() inside a run
            assert fake_libc.values == REUSE
        assert fake_libc.values == REUSE  # the outer run's settings, not glibc's defaults
        assert fake_libc.trims == 0
    assert fake_libc.values == GLIBC_DEFAULTS and fake_libc.trims == 1


def test_cpu_allocator_leaves_a_tuned_allocator_alone(monkeypatch):
    from leantrain.engine.devices import host_allocator as hostmem

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    monkeypatch.setattr(ctypes, "CDLL", lambda *a: pytest.fail("libc touched"))
    with hostmem.host_memory("reuse", "cpu") as applied:
        assert applied == "system"


def test_resume_ignores_keys_added_since_the_checkpoint_at_their_default():
    """Checkpoints written before data.quoting existed, with the allocator then 'reuse', still resume."""
    from leantrain.engine.checkpoint.resume import config_diff

    new = resolve(None, []).to_dict()
    old = json.loads(json.dumps(new))
    del old["data"]["quoting"]
    old["efficiency"]["cpu_allocator"] = "reuse"
    assert config_diff(old, new) == ([], [])
    assert config_diff(old, resolve(None, ["data.quoting=none"]).to_dict())[0] == ["data.quoting: None -> 'none'"]


# ------------------------------------------------------------------------------------------ issue 52, item 5: GRPO


GRPO_BAD_REWARDS = '''
def nan_reward(completions, **kwargs):
    return [0.5] + [float("nan")] * (len(completions) - 1)
'''


@pytest.mark.parametrize("case, says", [
    ("long prompt", "long.jsonl: line 3: the prompt is 60 tokens as cut (at most 60), and with "
                    "grpo.max_new_tokens=200 new tokens it takes more than the model's 256 positions"),
    ("nan reward", "reward nan_reward in the dry call on the first rows before training returned nan for completion 1 "
                   "of 2 (prompt 'What is 0 + 4?'); a reward is a finite number, or None"),
    ("empty prompt", "empty.jsonl: line 2: 'prompt' is empty"),
])
def test_grpo_bad_input_exits_2_before_any_worker_starts(tmp_path, capsys, monkeypatch, case, says):
    """GRPO's bad rows and rewards, found by the launcher's checks (``--nproc 2``: no worker started): a prompt with no
    room for grpo.max_new_tokens in the model's positions (file, line, numbers), a reward returning NaN (function,
    completion, prompt), an empty prompt (file, line: a prompt to answer has some text; an empty one would be answered
    from the template alone)."""
    import leantrain.launch.torchrun
    from tests.helpers import arithmetic_rows, grpo_args, write_grpo_files, write_jsonl

    def spawned(*a, **k):
        raise AssertionError("workers were started")

    monkeypatch.setattr(leantrain.launch.torchrun, "launch", spawned)
    root = write_grpo_files(tmp_path)
    rows = arithmetic_rows(12, 0)
    extra = []
    if case == "long prompt":
        long = {"prompt": "What is " + " + ".join(["1"] * 40) + "?", "answer": "40"}
        extra = [f"data.train={write_jsonl(root / 'long.jsonl', [*rows[:2], long, *rows[3:]])}",
                 "data.max_prompt_length=60", "grpo.max_new_tokens=200"]
    elif case == "nan reward":
        (root / "bad.py").write_text(GRPO_BAD_REWARDS)
        extra = [f"grpo.rewards=[{root / 'bad.py'}:nan_reward]"]
    else:
        extra = [f"data.train={write_jsonl(root / 'empty.jsonl', [rows[0], {**rows[1], 'prompt': ' '}, *rows[2:]])}"]
    assert main(["train", "--nproc", "2", *grpo_args(root, tmp_path / "out", *extra)]) == 2
    err = _err(capsys)
    assert says in err and "Traceback" not in err, err
