"""PyTorch equivalents of ddp's model zoo (models/zoo.cpp) and Fashion-MNIST loader.

build("mlp", hidden=[256]) and build("cnn") return a torch.nn.Sequential with the
same children, in the same order, as ddp's make_model, so a state_dict written by
`train --save` ("1.weight", "1.bias", ...) loads with load_state_dict(strict=True).

load_fashion_mnist(dir, "train" | "test") reads the IDX .gz files the way
runtime/data/dataset.cpp does: pixels scaled to [0, 1], then normalized with
mean 0.2860 and std 0.3530; inputs float32 [N, 1, 28, 28], labels int64 [N].
"""

import gzip
import os
import struct

import numpy as np
import torch
from torch import nn

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530
IDX_IMAGES_MAGIC = 0x00000803  # u8, 3 dimensions
IDX_LABELS_MAGIC = 0x00000801  # u8, 1 dimension
MODEL_NAMES = ("mlp", "cnn")


def build(model_name, hidden=(256,), in_channels=1, height=28, width=28, num_classes=10):
    """The torch.nn.Sequential equivalent of ddp::models::make_model."""
    if model_name == "mlp":
        hidden = list(hidden)
        if not hidden:
            raise ValueError("mlp needs at least one hidden layer size")
        layers = [nn.Flatten()]
        features = in_channels * height * width
        for h in hidden:
            layers += [nn.Linear(features, h), nn.ReLU()]
            features = h
        layers.append(nn.Linear(features, num_classes))
        return nn.Sequential(*layers)
    if model_name == "cnn":
        if height % 4 or width % 4:
            raise ValueError(
                f"cnn needs inputs whose height and width divide by 4, got {height}x{width}")
        return nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, stride=1, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, stride=1, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * (height // 4) * (width // 4), 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )
    raise ValueError(f"unknown model '{model_name}'; valid models: {', '.join(MODEL_NAMES)}")


def describe(model_name, hidden=(256,), in_features=784, num_classes=10):
    """The model name ddp writes into checkpoint metadata ("mlp 784-256-10", "cnn")."""
    if model_name == "mlp":
        return "mlp " + "-".join(str(x) for x in [in_features, *hidden, num_classes])
    return model_name


def parse_model_description(text):
    """Inverse of describe: "mlp 784-256-10" -> ("mlp", [256]); "cnn" -> ("cnn", [])."""
    if text == "cnn":
        return "cnn", []
    if text.startswith("mlp "):
        sizes = [int(x) for x in text[4:].split("-")]
        if len(sizes) < 3:
            raise ValueError(f"model '{text}': an mlp needs input, hidden and output sizes")
        return "mlp", sizes[1:-1]
    raise ValueError(f"model '{text}' is not one of ddp's zoo (mlp 784-...-10, cnn)")


def _read_idx(path, expected_magic):
    """The u8 payload of an IDX file (gzip or plain) as a numpy array of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise ValueError(f"{path}: too short for an IDX header ({len(data)} bytes)")
    (magic,) = struct.unpack(">I", data[:4])
    if magic != expected_magic:
        raise ValueError(
            f"{path}: magic number is 0x{magic:08x}, expected 0x{expected_magic:08x}")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated header")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    count = int(np.prod(shape))
    if len(data) - header != count:
        raise ValueError(
            f"{path}: header says {'x'.join(map(str, shape))} = {count} bytes, "
            f"file has {len(data) - header}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def _idx_path(directory, stem):
    for name in (stem + ".gz", stem):
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(
        f"{os.path.join(directory, stem)}.gz not found (apt-get install dataset-fashion-mnist, "
        "or use synthetic data)")


def load_fashion_mnist(directory=FASHION_MNIST_DIR, split="train"):
    """(inputs float32 [N, 1, 28, 28] normalized, labels int64 [N]) of one split."""
    if split not in ("train", "test"):
        raise ValueError(f"split '{split}': valid values are train, test")
    prefix = "train" if split == "train" else "t10k"
    images = _read_idx(_idx_path(directory, f"{prefix}-images-idx3-ubyte"), IDX_IMAGES_MAGIC)
    labels = _read_idx(_idx_path(directory, f"{prefix}-labels-idx1-ubyte"), IDX_LABELS_MAGIC)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{directory}: {images.shape[0]} images but {labels.shape[0]} labels")
    if labels.size and labels.max() > 9:
        raise ValueError(f"{directory}: labels must be 0..9, found {labels.max()}")
    x = torch.from_numpy(images.astype(np.float32)).div_(255.0)
    x = x.sub_(FASHION_MNIST_MEAN).div_(FASHION_MNIST_STD).unsqueeze(1).contiguous()
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def make_synthetic(n, num_classes=10, shape=(1, 28, 28), seed=1234, noise=1.0):
    """A learnable synthetic set in the spirit of ddp's make_synthetic (not bit-identical):
    class c has a random template, sample i is template[y_i] + noise * N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    features = int(np.prod(shape))
    templates = torch.randn(num_classes, features, generator=gen)
    y = torch.randint(0, num_classes, (n,), generator=gen, dtype=torch.int64)
    x = templates[y] + noise * torch.randn(n, features, generator=gen)
    return x.reshape(n, *shape).contiguous(), y
