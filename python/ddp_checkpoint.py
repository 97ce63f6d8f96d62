#!/usr/bin/env python3
"""Read ddp's safetensors checkpoints (`train --save`, `save_safetensors`) in Python.

Needs no package beyond the standard library to list a checkpoint, and PyTorch
alone (no `safetensors` package, which Debian 12 lacks) to load its tensors:

    import ddp_checkpoint
    model.load_state_dict(ddp_checkpoint.load_state_dict("run.st"))   # strict
    tensors, metadata = ddp_checkpoint.load("run.st")   # every tensor, optimizer's too

Installed as <prefix>/share/ddp/python/ddp_checkpoint.py (put that folder on
PYTHONPATH) and as the program `ddp-load`:

    ddp-load run.st                      # metadata and tensors: name, dtype, shape
    ddp-load run.st --to-torch run.pt    # torch.save of the model's state_dict

The format: an 8-byte little-endian header length N, N bytes of JSON (name ->
dtype, shape, data_offsets; "__metadata__" -> strings), then the tensors' bytes,
little-endian, tiling the data section exactly. Every violation raises
CheckpointError naming the file, the tensor and the offsets. Tensors named
"optimizer.*" are the optimizer's state (docs/checkpoints.md); the rest are the
model's, under PyTorch's state_dict names.
"""

import argparse
import json
import struct
import sys

__all__ = ["CheckpointError", "read_header", "load", "load_state_dict", "OPTIMIZER_PREFIX"]

# safetensors dtype -> (torch dtype name, bytes per element); ddp's six.
DTYPES = {
    "F32": ("float32", 4),
    "BF16": ("bfloat16", 2),
    "F16": ("float16", 2),
    "I32": ("int32", 4),
    "I64": ("int64", 8),
    "U8": ("uint8", 1),
}
MAX_HEADER_BYTES = 100 * 1000 * 1000
OPTIMIZER_PREFIX = "optimizer."


class CheckpointError(Exception):
    pass


def _read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror}") from None


def _parse(path, data):
    """(entries sorted by offset: (begin, end, name, dtype, shape), metadata, data start)."""
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
        header = json.loads(bytes(data[8:8 + header_len]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: the header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    body_size = len(data) - 8 - header_len

    entries = []
    for name, spec in header.items():
        dtype_name = spec.get("dtype") if isinstance(spec, dict) else None
        if dtype_name not in DTYPES:
            raise CheckpointError(
                f"{path}: tensor '{name}' has dtype '{dtype_name}', which is unknown or not "
                f"supported (valid: {', '.join(DTYPES)})")
        itemsize = DTYPES[dtype_name][1]
        shape = [int(d) for d in spec["shape"]]
        begin, end = (int(o) for o in spec["data_offsets"])
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * itemsize or begin > end:
            raise CheckpointError(
                f"{path}: tensor '{name}': data_offsets [{begin}, {end}] do not match its "
                f"shape: {dtype_name} {shape} needs {numel * itemsize} bytes")
        if end > body_size:
            raise CheckpointError(
                f"{path}: tensor '{name}': data_offsets [{begin}, {end}] are out of range: "
                f"the data section has {body_size} bytes")
        entries.append((begin, end, name, dtype_name, shape))

    # The tensors must tile the data section exactly, as the reference reader requires.
    entries.sort(key=lambda e: (e[0], e[1]))
    position = 0
    for begin, end, name, _, _ in entries:
        if begin != position:
            kind = "overlaps the previous tensor" if begin < position else "leaves a gap"
            raise CheckpointError(f"{path}: tensor '{name}' at [{begin}, {end}] {kind}")
        position = end
    if position != body_size:
        raise CheckpointError(f"{path}: {body_size - position} trailing bytes after the last tensor")
    return entries, metadata, 8 + header_len


def read_header(path):
    """(tensors: dict name -> (torch dtype name such as "float32", shape) in file order,
    metadata: dict str -> str). Needs no PyTorch."""
    entries, metadata, _ = _parse(path, _read_bytes(path))
    return {name: (DTYPES[dtype][0], shape) for _, _, name, dtype, shape in entries}, metadata


def load(path):
    """(tensors: dict name -> CPU torch.Tensor in file order, metadata: dict str -> str)."""
    import torch

    data = _read_bytes(path)
    entries, metadata, start = _parse(path, data)
    body = memoryview(data)[start:]
    tensors = {}
    for begin, end, name, dtype_name, shape in entries:
        dtype = getattr(torch, DTYPES[dtype_name][0])
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            # bytearray: a writable copy, so torch.frombuffer does not warn. The file
            # is little-endian, as is every machine PyTorch runs on.
            raw = bytearray(body[begin:end])
            tensors[name] = torch.frombuffer(raw, dtype=dtype).reshape(shape)
    return tensors, metadata


def check_whole(path, metadata, with_optimizer=False):
    """CheckpointError unless the file holds the model (and, with_optimizer, the
    optimizer state) itself: a `train --save-sharded` manifest keeps them in its
    shard files, which only train assembles."""
    shards = metadata.get("optimizer_shards")
    if shards is None:
        return
    files = f"{path}.shard<r>of{shards}.step{metadata.get('step', '<N>')}"
    fix = (f"write it whole with train, which trains no step when --epochs is the "
           f"checkpoint's (train <its flags> --resume {path} --epochs "
           f"{metadata.get('epoch', '<its epoch>')} --save whole.st, any world size, without "
           f"--save-sharded), then read that")
    if "zero3_shards" in metadata:
        raise CheckpointError(
            f"{path}: a --zero 3 --save-sharded manifest: the model's parameters are in its "
            f"{shards} shard files ({files}), which only train assembles; {fix}")
    if with_optimizer:
        raise CheckpointError(
            f"{path}: a --save-sharded manifest: the optimizer state is in its {shards} shard "
            f"files ({files}), which only train assembles; drop --with-optimizer for the "
            f"model alone, or {fix}")


def load_state_dict(path):
    """The model's tensors (every name but optimizer.*), for model.load_state_dict."""
    tensors, metadata = load(path)
    check_whole(path, metadata)
    return {k: v for k, v in tensors.items() if not k.startswith(OPTIMIZER_PREFIX)}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="ddp-load",
        description="List a ddp safetensors checkpoint (metadata, tensors), or convert its "
        "model state_dict to a PyTorch file that torch.load reads.",
        epilog="Exit codes: 0 ok; 2 usage error; 3 the checkpoint could not be read, or "
        "--to-torch without PyTorch.")
    parser.add_argument("checkpoint", help="safetensors file (train --save, save_safetensors)")
    parser.add_argument("--to-torch", metavar="OUT.pt",
                        help="write torch.save(state_dict) of the model's tensors (needs torch)")
    parser.add_argument("--with-optimizer", action="store_true",
                        help="with --to-torch: keep the optimizer.* tensors as well")
    args = parser.parse_args(argv)
    try:
        if args.to_torch:
            check_whole(args.checkpoint, read_header(args.checkpoint)[1], args.with_optimizer)
            try:
                import torch
            except ImportError:
                print("ddp-load: error: --to-torch needs PyTorch (apt-get install python3-torch, "
                      "or pip install torch)", file=sys.stderr)
                return 3
            tensors, metadata = load(args.checkpoint)
            if not args.with_optimizer:
                tensors = {k: v for k, v in tensors.items() if not k.startswith(OPTIMIZER_PREFIX)}
            torch.save(tensors, args.to_torch)
            print(f"wrote {len(tensors)} tensors to {args.to_torch} (torch.load it, then "
                  f"model.load_state_dict)")
            return 0
        tensors, metadata = read_header(args.checkpoint)
    except CheckpointError as e:
        print(f"ddp-load: error: {e}", file=sys.stderr)
        return 3
    for key in sorted(metadata):
        print(f"{key}: {metadata[key]}")
    model = [n for n in tensors if not n.startswith(OPTIMIZER_PREFIX)]
    print(f"{len(model)} model tensors, {len(tensors) - len(model)} optimizer tensors:")
    for name, (dtype, shape) in tensors.items():
        print(f"  {name} {dtype} {shape}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # `ddp-load run.st | head`: the reader has what it wanted
        sys.stderr.close()
        sys.exit(0)
