"""Image inputs: files checked by their header up front; each batch is read, converted to RGB, optionally
augmented (``data.augment``: random resized crop and horizontal flip) and run through the model's image processor
(resize, rescale, normalise) by the collator, on the fly: nothing decoded is cached, so augmentation differs from
epoch to epoch. Every example has the same ``length`` (1), so length-grouped batching is a plain shuffle."""

from __future__ import annotations

import math

import numpy as np
import torch

from leantrain.config import DataConfig
from leantrain.data import media
from leantrain.errors import DataError

EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


def probe(path: str) -> str | None:
    """Why PIL cannot read the file's header, or None. Cheap: the pixels are not decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.size  # noqa: B018 - the header is parsed on open
    except UnidentifiedImageError:
        return "not an image format Pillow can read"
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return None


KIND = media.MediaKind("image", "data.image_column", EXTENSIONS, probe, ("image", "img", "image_path", "image_file"))


def load_and_validate(cfg: DataConfig, *, seed: int, batch_size: int, known_labels: list[str] | None = None):
    return media.load_and_validate(cfg, KIND, seed=seed, batch_size=batch_size, known_labels=known_labels)


def load_rows(path: str, cfg: DataConfig, *, require_labels: bool, known_labels: list[str] | None):
    return media.load_rows(path, cfg, KIND, require_labels=require_labels, known_labels=known_labels)


def process(dataset, processor, cfg: DataConfig, desc: str = ""):
    """Canonical (image, [label]) -> (image, [labels], length): paths stay paths, the collator decodes."""
    if "label" in dataset.column_names:
        dataset = dataset.rename_column("label", "labels")
    return dataset.add_column("length", [1] * len(dataset))


def open_rgb(path: str):
    """The image at ``path`` as RGB (grayscale, palette, RGBA, CMYK converted); DataError naming the path."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB")
    except Exception as e:  # noqa: BLE001 - any decoder failure names the file
        raise DataError(f"cannot decode image file {path} ({type(e).__name__}: {e})") from None


def augment(im, rng: np.random.Generator):
    """Random resized crop (area 80-100%, aspect 3/4-4/3, back to the original size) and a horizontal flip."""
    from PIL import Image

    w, h = im.size
    cw, ch = w, h
    for _ in range(10):
        area = w * h * rng.uniform(0.8, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        tw, th = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
        if 0 < tw <= w and 0 < th <= h:
            cw, ch = tw, th
            break
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    im = im.resize((w, h), Image.Resampling.BILINEAR, box=(x, y, x + cw, y + ch))
    return im.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else im


class ImageCollator:
    """Rows (image path, [labels], loss_weight) -> the processor's tensors (pixel_values, ...) + labels + loss_weight.

    The augmentation stream is seeded by (seed, DataLoader worker): reproducible, nothing rank-specific."""

    def __init__(self, processor, *, augment: bool = False, seed: int = 0):
        self.processor, self.augment, self.seed = processor, augment, seed
        self._rng: np.random.Generator | None = None

    def _generator(self) -> np.random.Generator:
        if self._rng is None:
            info = torch.utils.data.get_worker_info()
            self._rng = np.random.default_rng([self.seed, info.id if info is not None else 0])
        return self._rng

    def __call__(self, rows: list[dict]) -> dict[str, torch.Tensor]:
        images = [open_rgb(r["image"]) for r in rows]
        if self.augment:
            images = [augment(im, self._generator()) for im in images]
        out = {k: v for k, v in self.processor(images=images, return_tensors="pt").items()}
        if "labels" in rows[0]:
            out["labels"] = torch.tensor([r["labels"] for r in rows], dtype=torch.long)
        out["loss_weight"] = torch.tensor([r.get("loss_weight", 1.0) for r in rows], dtype=torch.float32)
        return out


def collator(processor, cfg: DataConfig, *, train: bool, seed: int = 0, device_type: str = "cpu") -> ImageCollator:
    return ImageCollator(processor, augment=train and cfg.augment, seed=seed)
