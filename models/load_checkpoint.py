#!/usr/bin/python3
"""Load a checkpoint written by ddp's `train --save` into PyTorch and evaluate it.

The safetensors file is parsed with plain Python (no safetensors package):
8-byte little-endian header length N, N bytes of JSON header, then the raw
little-endian tensor data. The model is rebuilt from the metadata's "model"
("mlp 784-256-10", "cnn"), the non-"optimizer." tensors are loaded with
load_state_dict(strict=True), and the test accuracy on Fashion-MNIST's test
split is printed:

    torch test_acc 0.8421 (checkpoint epoch 1, model mlp 784-256-10)

Exit codes: 0 ok, 1 accuracy differs from --expect by more than --tolerance,
2 usage error, 3 the checkpoint or data could not be read or loaded.
"""

import argparse
import json
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_models  # noqa: E402

# safetensors dtype -> (torch dtype, bytes per element); ddp's six.
DTYPES = {
    "F32": (torch.float32, 4),
    "BF16": (torch.bfloat16, 2),
    "F16": (torch.float16, 2),
    "I32": (torch.int32, 4),
    "I64": (torch.int64, 8),
    "U8": (torch.uint8, 1),
}
MAX_HEADER_BYTES = 100 * 1000 * 1000
OPTIMIZER_PREFIX = "optimizer."


class CheckpointError(Exception):
    pass


def read_safetensors(path):
    """(tensors: dict name -> CPU tensor in file order, metadata: dict str -> str)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise CheckpointError(f"{path}: the file has {len(data)} bytes, too short for a header")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > MAX_HEADER_BYTES:
        raise CheckpointError(f"{path}: header length {header_len} is over 100 MB")
    if 8 + header_len > len(data):
        raise CheckpointError(
            f"{path}: header length {header_len} is beyond the end of the file "
            f"({len(data)} bytes)")
    try:
        header = json.loads(data[8:8 + header_len].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: the header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    body = memoryview(data)[8 + header_len:]

    entries = []
    for name, spec in header.items():
        dtype_name = spec.get("dtype")
        if dtype_name not in DTYPES:
            raise CheckpointError(
                f"{path}: tensor '{name}' has dtype '{dtype_name}', which is unknown or not "
                f"supported (valid: {', '.join(DTYPES)})")
        dtype, itemsize = DTYPES[dtype_name]
        shape = [int(d) for d in spec["shape"]]
        begin, end = (int(o) for o in spec["data_offsets"])
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * itemsize or begin > end:
            raise CheckpointError(
                f"{path}: tensor '{name}': data_offsets [{begin}, {end}] do not match its "
                f"shape: {dtype_name} {shape} needs {numel * itemsize} bytes")
        if end > len(body):
            raise CheckpointError(
                f"{path}: tensor '{name}': data_offsets [{begin}, {end}] are out of range: "
                f"the data section has {len(body)} bytes")
        entries.append((begin, end, name, dtype, shape))

    # The tensors must tile the data section exactly, as the reference reader requires.
    entries.sort(key=lambda e: (e[0], e[1]))
    position = 0
    for begin, end, name, _, _ in entries:
        if begin != position:
            kind = "overlaps the previous tensor" if begin < position else "leaves a gap"
            raise CheckpointError(f"{path}: tensor '{name}' at [{begin}, {end}] {kind}")
        position = end
    if position != len(body):
        raise CheckpointError(
            f"{path}: {len(body) - position} trailing bytes after the last tensor")

    tensors = {}
    for begin, end, name, dtype, shape in entries:
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            # bytearray: a writable copy, so torch.frombuffer does not warn.
            raw = bytearray(body[begin:end])
            tensors[name] = torch.frombuffer(raw, dtype=dtype).reshape(shape)
    return tensors, metadata


def evaluate(model, inputs, labels, batch_size=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(labels), batch_size):
            predicted = model(inputs[i:i + batch_size]).argmax(dim=1)
            correct += int((predicted == labels[i:i + batch_size]).sum())
    return correct / max(len(labels), 1)


def load_model(path, hidden_override=None):
    """(model with the checkpoint's weights, metadata). Raises CheckpointError."""
    tensors, metadata = read_safetensors(path)
    model_text = metadata.get("model")
    if model_text is None:
        raise CheckpointError(f"{path}: the metadata has no 'model' (not a ddp checkpoint?)")
    try:
        name, hidden = torch_models.parse_model_description(model_text)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None
    if hidden_override is not None and name == "mlp" and hidden_override != hidden:
        raise CheckpointError(
            f"{path}: the checkpoint holds '{model_text}', but --hidden says "
            f"{','.join(map(str, hidden_override))}")
    model = torch_models.build(name, hidden=hidden or [256])
    state = {k: v for k, v in tensors.items() if not k.startswith(OPTIMIZER_PREFIX)}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: {e}") from None
    return model, metadata


def parse_hidden(text):
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or any(s <= 0 for s in sizes):
        raise argparse.ArgumentTypeError(
            f"'{text}': expected positive layer sizes separated by commas, like 256 or 512,256")
    return sizes


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Load a ddp `train --save` safetensors checkpoint into the equivalent "
        "torch.nn.Sequential (strict=True) and print its Fashion-MNIST test accuracy.",
        epilog="Exit codes: 0 ok; 1 the accuracy differs from --expect by more than "
        "--tolerance; 2 usage error; 3 the checkpoint or the data could not be read or loaded.")
    parser.add_argument("checkpoint", help="safetensors file written by `train --save`")
    parser.add_argument("--data", default=torch_models.FASHION_MNIST_DIR,
                        help="Fashion-MNIST folder with the IDX .gz files (default %(default)s)")
    parser.add_argument("--hidden", type=parse_hidden, default=None,
                        help="mlp hidden sizes, e.g. 256 or 512,256; optional, the checkpoint's "
                        "metadata names the model, this only checks it agrees")
    parser.add_argument("--expect", type=float, default=None,
                        help="expected test accuracy (e.g. the test_acc printed by `train`)")
    parser.add_argument("--tolerance", type=float, default=0.002,
                        help="allowed |accuracy - expect| (default %(default)s)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default %(default)s)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    try:
        model, metadata = load_model(args.checkpoint, args.hidden)
        inputs, labels = torch_models.load_fashion_mnist(args.data, "test")
    except (CheckpointError, OSError, ValueError) as e:
        print(f"load_checkpoint: error: {e}", file=sys.stderr)
        return 3
    accuracy = evaluate(model, inputs, labels)
    print(f"torch test_acc {accuracy:.4f} (checkpoint epoch {metadata.get('epoch', '?')}, "
          f"model {metadata.get('model')})")
    if args.expect is not None and abs(accuracy - args.expect) > args.tolerance:
        print(f"load_checkpoint: test_acc {accuracy:.4f} differs from the expected "
              f"{args.expect:.4f} by more than {args.tolerance}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
