#!/usr/bin/python3
"""Load a checkpoint written by ddp's `train --save` into PyTorch and evaluate it.

The safetensors file is parsed with plain Python (no safetensors package) by
python/ddp_checkpoint.py, which the package installs (`ddp-load`). The model is rebuilt from the metadata's "model"
("mlp 784-256-10", "cnn"), the non-"optimizer." tensors are loaded with
load_state_dict(strict=True), and the test accuracy on Fashion-MNIST's test
split is printed:

    torch test_acc 0.8421 (checkpoint epoch 1, model mlp 784-256-10)

Exit codes: 0 ok, 1 accuracy differs from --expect by more than --tolerance,
2 usage error, 3 the checkpoint or data could not be read or loaded.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import ddp_checkpoint  # noqa: E402
import torch_models  # noqa: E402

# The reader itself is the installed module python/ddp_checkpoint.py.
CheckpointError = ddp_checkpoint.CheckpointError
OPTIMIZER_PREFIX = ddp_checkpoint.OPTIMIZER_PREFIX
read_safetensors = ddp_checkpoint.load


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
