"""Images and audio on slices of ../shared/data (CIFAR-10 subset, FSDD): folder and path-column sources, image file
checks, and short from-config training runs that must beat chance. Synthetic audio files, processors built from a
config and task detection are in tests/unit/data/test_media.py; audio on 2 processes == 1 process is tested in
test_tasks_distributed.py, in its shared launch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import TINY_AST, TINY_CONVNEXT, shared_data, write_fsdd4, write_rows
from leantrain.cli import main
from leantrain.config import DataConfig
from leantrain.data import audio, image
from leantrain.errors import DataError

pytestmark = pytest.mark.usefixtures("own_datasets_cache")  # each test its own Arrow cache, never ~/.cache
CLASSES4 = ["airplane", "automobile", "frog", "ship"]


@pytest.fixture(scope="module")
def cifar4(tmp_path_factory) -> Path:
    """train/ and test/ with a folder per class: 4 classes, 80 + 25 images each (links to the shared files)."""
    src, root = shared_data("cifar10_subset"), tmp_path_factory.mktemp("cifar4")
    for split, n in (("train", 80), ("test", 25)):
        for c in CLASSES4:
            (root / split / c).mkdir(parents=True)
            for f in sorted((src / split / c).iterdir())[:n]:
                (root / split / c / f.name).symlink_to(f)
    return root


@pytest.fixture(scope="module")
def fsdd4(tmp_path_factory) -> tuple[Path, Path]:
    """Digits 0-3 of FSDD, every speaker: repetitions 5-14 to train (240 clips), 0-2 held out (72)."""
    return write_fsdd4(tmp_path_factory.mktemp("fsdd4"))


# ----------------------------------------------------------------------------------------------- data


def test_image_folder_splits_and_labels(cifar4):
    data = image.load_and_validate(DataConfig(train=str(cifar4)), seed=0, batch_size=8)
    assert (len(data.train), len(data.eval)) == (320, 100)  # split folders: train/ trains, test/ evaluates
    assert data.label_names == CLASSES4 and data.train.column_names == ["image", "label"]
    assert Path(data.train[0]["image"]).is_file() and data.train[0]["label"] == 0
    assert f"labels: the class folder names of {cifar4}" in data.notes


def test_bad_image_files_reported_by_path_before_any_model(tmp_path, cifar4, capsys):
    from PIL import Image

    good = sorted((cifar4 / "train" / "frog").iterdir())[:4]
    (tmp_path / "img").mkdir()
    Image.open(good[0]).convert("L").save(tmp_path / "img" / "gray.png")  # grayscale: fine, converted to RGB
    (tmp_path / "img" / "broken.jpg").write_bytes(b"this is not a JPEG")
    rows = [{"file": str(f), "y": "frog"} for f in good] + [
        {"file": "img/gray.png", "y": "cat"}, {"file": "img/broken.jpg", "y": "cat"}, {"file": "img/gone.jpg", "y": "cat"}]
    csv = write_rows(tmp_path / "photos.csv", rows)
    with pytest.raises(DataError) as e:
        image.load_and_validate(DataConfig(train=str(csv), image_column="file", label_column="y"), seed=0, batch_size=2)
    text = str(e.value)
    assert f"cannot read image file {tmp_path / 'img' / 'broken.jpg'}" in text
    assert "1 image file(s) not found (line 8)" in text and str(tmp_path / "img" / "gone.jpg") in text
    assert "gray.png" not in text and len(e.value.problems) == 2
    out = tmp_path / "run"
    assert main(["train", "model.task=image-classification", f"data.train={csv}", "data.image_column=file",
                 "data.label_column=y", f"output_dir={out}"]) == 2
    assert "broken.jpg" in capsys.readouterr().err and not out.exists()


def test_image_decoding_error_later_names_the_path(tmp_path, cifar4):
    from transformers import ViTImageProcessor

    jpg = sorted((cifar4 / "train" / "ship").iterdir())[0].resolve()
    cut = tmp_path / "cut.jpg"
    data = jpg.read_bytes()
    cut.write_bytes(data[: data.index(b"\xff\xda") + 40])  # the header parses, the pixels stop short
    assert image.probe(str(cut)) is None
    collate = image.collator(ViTImageProcessor(size={"height": 32, "width": 32}), DataConfig(), train=False)
    assert collate([{"image": str(jpg), "labels": 1}])["pixel_values"].shape == (1, 3, 32, 32)
    with pytest.raises(DataError, match=f"cannot decode image file {cut}"):
        collate([{"image": str(cut), "labels": 0}])


def test_augmentation_is_seeded_and_keeps_the_size(cifar4):
    from transformers import ViTImageProcessor

    rows = [{"image": str(f), "labels": 0} for f in sorted((cifar4 / "train" / "frog").iterdir())[:8]]
    proc = ViTImageProcessor(size={"height": 32, "width": 32})
    plain = image.collator(proc, DataConfig(augment=True), train=False)(rows)["pixel_values"]
    a = image.collator(proc, DataConfig(augment=True), train=True, seed=1)(rows)["pixel_values"]
    b = image.collator(proc, DataConfig(augment=True), train=True, seed=1)(rows)["pixel_values"]
    assert a.shape == plain.shape and np.array_equal(a.numpy(), b.numpy()) and not np.allclose(a.numpy(), plain.numpy())


# ----------------------------------------------------------------------------------------------- training


def test_image_model_from_config_trains_and_loads_in_pipeline(tmp_path, cifar4):
    from transformers import pipeline

    from leantrain import train

    out = tmp_path / "run"
    summary = train(None, [*TINY_CONVNEXT, f"data.train={cifar4}", "data.augment=true", "train.epochs=3",
                           "train.batch_size=16", "train.lr=3e-3", f"output_dir={out}", "report.plots=false"])
    assert summary["eval"]["samples"] == 100 and summary["eval"]["accuracy"] > 0.4  # chance: 0.25
    assert summary["train"]["tokens_per_second"] is None and summary["train"]["samples_per_second"] > 0
    assert (out / "model" / "preprocessor_config.json").is_file()
    photos = sorted((cifar4 / "test" / "ship").iterdir())[:6]
    preds = tmp_path / "p.jsonl"
    assert main(["predict", str(out / "model"), "--input", str(cifar4 / "test" / "ship"), "--output", str(preds)]) == 0
    ours = [json.loads(line) for line in preds.read_text().splitlines()][:6]
    theirs = pipeline("image-classification", model=str(out / "model"), device="cpu")([str(p) for p in photos], top_k=1)
    assert [o["label"] for o in ours] == [t[0]["label"] for t in theirs] and set(o["label"] for o in ours) <= set(CLASSES4)
    assert [o["score"] for o in ours] == pytest.approx([t[0]["score"] for t in theirs], abs=1e-4)
    assert [o["path"] for o in ours] == [str(p.resolve()) for p in photos]


def test_audio_model_from_config_trains_and_loads_in_pipeline(tmp_path, fsdd4):
    from transformers import pipeline

    from leantrain import train

    train_csv, test_csv = fsdd4
    out = tmp_path / "run"
    summary = train(None, [*TINY_AST, f"data.train={train_csv}", f"data.eval={test_csv}", "train.epochs=6",
                           "train.batch_size=16", "train.lr=3e-3", f"output_dir={out}", "report.plots=false",
                           "efficiency.precision=fp32"])  # `leantrain eval` runs in fp32: the same predictions
    assert summary["eval"]["samples"] == 72 and summary["eval"]["accuracy"] > 0.4  # chance: 0.25
    assert summary["model"]["labels"] == ["0", "1", "2", "3"] and summary["train"]["tokens_per_second"] is None
    clip = shared_data("fsdd", "recordings", "3_theo_0.wav")
    classify = pipeline("audio-classification", model=str(out / "model"), device="cpu")
    top = classify({"raw": audio.read_audio(str(clip), 16000, 1.0), "sampling_rate": 16000}, top_k=4)
    assert sorted(t["label"] for t in top) == ["0", "1", "2", "3"]
    assert main(["eval", str(out / "model"), f"data.eval={test_csv}", "--output", str(tmp_path / "m.json")]) == 0
    again = json.loads((tmp_path / "m.json").read_text())["eval"]
    assert again["accuracy"] == pytest.approx(summary["eval"]["accuracy"])
