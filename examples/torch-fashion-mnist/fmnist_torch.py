"""Fashion-MNIST for PyTorch jobs: the IDX loader, the model, and progress
reports to the lender's node.

Installed into the job's image by `deepmarket env build` (this folder's
pyproject.toml), and shipped in the job's bundle beside train.py.
Imports torch, numpy and the standard library only.
"""

import gzip
import json
import os
import struct
import time

import numpy as np
import torch
from torch import nn

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def read_idx(data_dir, name):
    """The IDX array `name` of data_dir (gzipped or not)."""
    for path, opener in ((os.path.join(data_dir, name), open), (os.path.join(data_dir, name + ".gz"), gzip.open)):
        if os.path.exists(path):
            with opener(path, "rb") as f:
                data = f.read()
            _, _, dtype, ndim = struct.unpack(">BBBB", data[:4])
            if dtype != 0x08:
                raise ValueError("%s: IDX type %#x, want unsigned bytes" % (path, dtype))
            shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
            return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)
    raise FileNotFoundError("%s[.gz] is not in %s" % (name, data_dir))


def load(data_dir):
    """(train x, train y, test x, test y) as tensors, images in [0, 1]."""
    arrays = {k: read_idx(data_dir, v) for k, v in FILES.items()}

    def images(a):
        return torch.from_numpy(a.astype(np.float32) / 255.0).reshape(len(a), -1)

    return (images(arrays["train_images"]), torch.from_numpy(arrays["train_labels"].astype(np.int64)),
            images(arrays["test_images"]), torch.from_numpy(arrays["test_labels"].astype(np.int64)))


def model():
    """A small MLP: 784 -> 128 -> 10 (101,770 parameters, 407 KB of
    gradients to all-reduce a step)."""
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def cnn_wide():
    """The fashion-mnist example's cnn-wide in PyTorch (two 3x3
    convolutions of 32 and 64 filters, each pooled, then 128 units; 0.4M
    weights): compute-bound, enough arithmetic a step for a GPU to matter."""
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


MODELS = {"mlp": model, "cnn-wide": cnn_wide}


_last = [0.0]


def report(steps, total, loss=None, accuracy=None, eval_accuracy=None, force=False):
    """Tells the lender's node the worker's progress (DM_PROGRESS_FILE, at
    most once a second): each machine is paid up to its last progress."""
    path = os.environ.get("DM_PROGRESS_FILE")
    now = time.monotonic()
    if not path or (not force and now - _last[0] < 1.0):
        return
    _last[0] = now
    loss = loss.item() if isinstance(loss, torch.Tensor) else loss  # waits for the step: once a second at most
    rec = {"units": int(steps), "steps": int(steps), "total": int(total)}
    for k, v in (("loss", loss), ("accuracy", accuracy), ("eval_accuracy", eval_accuracy)):
        if v is not None:
            rec[k] = float(v)
    if eval_accuracy is not None:
        rec["eval_at"] = int(steps)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)
