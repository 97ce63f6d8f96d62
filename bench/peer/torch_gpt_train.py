#!/usr/bin/python3
"""The PyTorch peer of `train --model gpt-*`: the same GPT, batch and optimizer, timed.

Trains models/torch_gpt.py's Gpt (the reference of ddp's models/gpt.h; by default eager
fp32 with an explicit causal mask and softmax, as nanoGPT without flash attention, which
PyTorch 1.13 runs) on random contiguous windows of a byte stream, with AdamW over
nanoGPT's two parameter groups (weight decay on the 2-D weights only), global
gradient-norm clipping and a constant learning rate. After --warmup untimed steps it
times --steps steps and prints one JSON line:

  {"impl": "torch", "model": "gpt-mini", "batch": 8, "context": 256, "threads": 1,
   "tokens_per_s": ..., "step_ms": ..., ...}

The byte stream is --stream-bytes random bytes from the seed (the Brown corpus's
training split is 5.4 MB): what a step computes does not depend on the token values,
and the stream is in memory before timing starts (pre-loaded data). Each step gathers
--batch windows of context + 1 bytes at random offsets (inputs and the targets shifted
by one), as ddp's TextWindowSampler does per rank.

What the timing includes: window gathering, forward, loss, backward, clipping, the
optimizer step and one loss.item() per step. It excludes building the model, the
stream and the warmup steps.

On a GPU (--device cuda): the model, the stream and the windows live on the device,
matmuls run in fp32 (TF32 off, PyTorch's default and what ddp's cuBLAS sgemm does;
--tf32 turns it on), and loss.item() ends every step, so the timer measures finished work.

PyTorch at its strictest (the peer of our GPU benchmarks), each part a flag:

  --precision bf16  forward and loss under torch.autocast(device, torch.bfloat16); the
                    weights, gradients and AdamW state stay fp32 (no GradScaler: bf16
                    has fp32's exponent range). Runs on the CPU too (PyTorch >= 1.10).
  --sdpa            attention through F.scaled_dot_product_attention(is_causal=True)
                    (a fused kernel; flash attention in bf16 on CUDA), dropout_p = the
                    model's dropout while training. PyTorch >= 2.0.
  --compile         model = torch.compile(model) (under DDP the wrapped model, whose
                    DDPOptimizer splits the graph at the buckets). PyTorch >= 2.0.
                    Compilation happens
                    in the first warmup step, so --compile needs --warmup >= 2; the
                    default 3 leaves it and the first run of the compiled graphs untimed.
  --fused-adamw     torch.optim.AdamW(fused=True): one kernel for all parameters. CUDA
                    and PyTorch >= 2.0.
  --tf32            torch.backends.cuda.matmul.allow_tf32 = cudnn.allow_tf32 = True
                    (fp32 matmuls on the tensor cores). CUDA only.
  --strict          all of the above: --precision bf16 --sdpa --compile --fused-adamw
                    --tf32; CUDA and PyTorch >= 2.0. The eager bf16 form is
                    --precision bf16 --sdpa --fused-adamw --tf32 (no --compile).

A flag this torch or device cannot run is a usage error (exit 2) that names the
installed torch version and what the flag needs; nothing falls back silently.

When any of these flags or --peak-tflops is on the command line (even --precision fp32),
the JSON row also carries "precision", "sdpa", "compile", "fused_adamw" and "tf32", and
on CUDA "peak_memory_mib": torch.cuda.max_memory_allocated of rank 0's device after the
timed steps, with the peak reset before the first warmup step, so it covers compilation,
warmup and the timed steps (the peak is what must fit). Without them the row keeps its
keys (impl, model, spec, batch, context, threads, device, tokens_per_s, step_ms, steps,
warmup, world_size, bucket_cap_mb, last_loss, torch), as bench/gpu/steps.sh and
bench/gpt_vs_torch.py read them.

--peak-tflops X (one device's dense peak for the precision run, e.g. 989 for an H200's
bf16) adds "parameters" (N) and "mfu", model FLOPs utilisation as llm.c's
gpt2_estimate_mfu counts it: FLOPs per token = 6 * N + 6 * L * C * T, with N every
parameter of the model (the tied token embedding once, the position embedding included,
as llm.c's num_parameters), L layers, C = d_model and T = the context; mfu = FLOPs per
token * tokens_per_s (all ranks) / (world_size * X * 1e12).

--profile-steps N runs N more steps after the timed ones under torch.profiler (the peer
of `bench gpt --profile-steps`, Note [op profile] in runtime/profile.h) and prints the
longest entries to stderr; --profile-out FILE also writes them as JSON lines (op,
device, calls_per_step, ms_per_step, share_of_step, then "(every entry)" and the rest of
the step). On CUDA an entry is a kernel (a compiled model's are Triton's and cuBLAS's)
with its device time, so their sum is the time the GPU was busy; on the CPU an entry is
an aten op with its self time (no op's time counted twice). The profiler's own host
cost slows these steps; the timed ones above are unaffected.

Distributed: if WORLD_SIZE > 1 in the environment (set RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT yourself, or launch it with ddprun), torch.distributed is initialized with
gloo, the model is wrapped in DistributedDataParallel(bucket_cap_mb=...), each rank
draws its own windows, and only rank 0 prints; --batch is per rank and tokens_per_s
counts all ranks' tokens.
"""

import argparse
import contextlib
import inspect
import json
import os
import sys
import time


def _early_threads(argv):
    """--threads, read before torch (and its OpenBLAS) is loaded."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--threads", default="1")
    return early.parse_known_args(argv)[0].threads


# torch.set_num_threads does not reach the OpenBLAS that Debian's torch calls for
# Linear layers; OpenBLAS reads its thread count from the environment when it loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", _early_threads(sys.argv[1:]))
os.environ.setdefault("OMP_NUM_THREADS", _early_threads(sys.argv[1:]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
import torch_gpt  # noqa: E402


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}': must be >= 1")
    return value


# The flags that need PyTorch >= 2.0, and whether this torch has what each calls.
TORCH2 = "PyTorch >= 2.0"
TORCH2_FEATURES = {
    "--sdpa": ("F.scaled_dot_product_attention", torch_gpt.has_sdpa),
    "--compile": ("torch.compile", lambda: hasattr(torch, "compile")),
    "--fused-adamw": ("torch.optim.AdamW(fused=True)",
                      lambda: "fused" in inspect.signature(torch.optim.AdamW).parameters),
}
COMPILE_MIN_WARMUP = 2  # the step that compiles, then one run of the compiled graphs


def torch_version_text():
    return f"this is torch {torch.__version__} ({os.path.dirname(torch.__file__)})"


def new_flags_given(args):
    """Whether the command line names a flag of the strict forms (the row then says them)."""
    return (args.precision is not None or args.sdpa or args.compile or args.fused_adamw
            or args.tf32 or args.strict or args.peak_tflops > 0)


def check_strict_flags(parser, args):
    """Expands --strict and refuses what this device or torch cannot run (exit 2)."""
    cuda = args.device.startswith("cuda")
    if args.strict:
        if not cuda:
            missing = [f for f in ("--sdpa", "--compile") if not TORCH2_FEATURES[f][1]()]
            torch2 = (f"; {' and '.join(missing)} need {TORCH2}, {torch_version_text()}"
                      if missing else "")
            parser.error(f"--strict needs --device cuda (given --device {args.device}): fused "
                         f"AdamW and TF32 exist only on CUDA. On the CPU give the parts that "
                         f"apply: --precision bf16 --sdpa --compile{torch2}")
        if args.precision not in (None, "bf16"):
            parser.error(f"--strict runs --precision bf16, not {args.precision}: give one or "
                         "the other (the fp32 form is --sdpa --compile --fused-adamw --tf32)")
        args.precision, args.sdpa, args.compile = "bf16", True, True
        args.fused_adamw, args.tf32 = True, True
    args.report_modes = new_flags_given(args)
    args.precision = args.precision or "fp32"
    if not cuda:
        for flag, on, what in (("--fused-adamw", args.fused_adamw, "fused AdamW is CUDA-only"),
                               ("--tf32", args.tf32, "TF32 is a CUDA matmul mode")):
            if on:
                parser.error(f"{flag} needs --device cuda (given --device {args.device}): "
                             f"{what}; leave {flag} out on the CPU")
    wanted = {"--sdpa": args.sdpa, "--compile": args.compile, "--fused-adamw": args.fused_adamw}
    missing = [f"{flag} ({TORCH2_FEATURES[flag][0]})" for flag, on in wanted.items()
               if on and not TORCH2_FEATURES[flag][1]()]
    if missing:
        one = len(missing) == 1
        parser.error(f"{', '.join(missing)} need{'s' if one else ''} {TORCH2}; "
                     f"{torch_version_text()}. Run it with a python whose torch is >= 2.0 "
                     f"(PYTHON=...), or leave {'the flag' if one else 'those flags'} out")
    if args.compile and args.warmup < COMPILE_MIN_WARMUP:
        parser.error(f"--warmup {args.warmup} with --compile: the first step compiles the "
                     f"model (seconds to minutes), which the timer must not count; give "
                     f"--warmup >= {COMPILE_MIN_WARMUP} (default 3)")
    if args.peak_tflops < 0:
        parser.error(f"--peak-tflops {args.peak_tflops:g}: must be > 0 (the device's dense "
                     "peak in TFLOP/s), or 0 for no mfu")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Time PyTorch training steps of ddp's GPT (the peer of `train --model gpt-*`).",
        epilog="Prints one JSON line on stdout. See the module docstring for what is timed.")
    parser.add_argument("--model", default="gpt-mini",
                        help="gpt-tiny, gpt-mini, gpt2 or a gpt: spec (default %(default)s)")
    parser.add_argument("--batch", "--batch-size", dest="batch", type=positive_int, default=8,
                        help="sequences per step (per rank) (default %(default)s)")
    parser.add_argument("--steps", type=positive_int, default=20,
                        help="timed training steps (default %(default)s)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed steps before timing (default %(default)s)")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch.set_num_threads (default %(default)s)")
    parser.add_argument("--lr", type=float, default=1e-3, help="constant lr (default %(default)s)")
    parser.add_argument("--weight-decay", type=float, default=0.1,
                        help="weight decay of the 2-D weights (default %(default)s)")
    parser.add_argument("--clip-grad-norm", type=float, default=1.0,
                        help="global gradient-norm clipping, 0 = off (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="init and data seed (default 0)")
    parser.add_argument("--stream-bytes", type=positive_int, default=5_366_311,
                        help="bytes of the random stream (default: the Brown train split's)")
    parser.add_argument("--device", default="cpu",
                        help="cpu or cuda[:N]; on CUDA the timer waits for the device "
                             "(fp32 matmuls, TF32 off unless --tf32) (default %(default)s)")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DistributedDataParallel bucket_cap_mb (default %(default)s)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="then N more steps under torch.profiler: the longest kernels "
                             "(CUDA) or ops (CPU) on stderr (default 0: none)")
    parser.add_argument("--profile-out", default=None,
                        help="with --profile-steps: also write the entries as JSON lines here")
    strict = parser.add_argument_group(
        "PyTorch at its strictest", "each part alone, or all with --strict; a part this torch "
        "or device cannot run is an error, never a silent fallback")
    strict.add_argument("--precision", choices=("fp32", "bf16"), default=None,
                        help="bf16: forward and loss under torch.autocast(bfloat16), weights "
                             "and AdamW state fp32 (default fp32)")
    strict.add_argument("--sdpa", action="store_true",
                        help="attention through F.scaled_dot_product_attention(is_causal=True) "
                             "instead of the explicit mask (PyTorch >= 2.0)")
    strict.add_argument("--compile", action="store_true",
                        help="torch.compile the model; compiles during warmup, needs "
                             f"--warmup >= {COMPILE_MIN_WARMUP} (PyTorch >= 2.0)")
    strict.add_argument("--fused-adamw", action="store_true",
                        help="torch.optim.AdamW(fused=True) (CUDA, PyTorch >= 2.0)")
    strict.add_argument("--tf32", action="store_true",
                        help="TF32 matmuls and convolutions (CUDA)")
    strict.add_argument("--strict", action="store_true",
                        help="--precision bf16 --sdpa --compile --fused-adamw --tf32 "
                             "(CUDA, PyTorch >= 2.0)")
    strict.add_argument("--peak-tflops", type=float, default=0.0,
                        help="the device's dense peak TFLOP/s for the precision run; adds "
                             "\"mfu\" (llm.c's count) to the row (default 0: no mfu)")
    args = parser.parse_args(argv)
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.profile_steps < 0:
        parser.error(f"--profile-steps {args.profile_steps}: must be >= 0")
    if args.profile_out and args.profile_steps == 0:
        parser.error("--profile-out writes what --profile-steps records: give --profile-steps N")
    try:
        args.config = torch_gpt.parse_model(args.model)
    except ValueError as e:
        parser.error(str(e))
    if args.device != "cpu" and not args.device.startswith("cuda"):
        parser.error(f"--device {args.device}: valid values are cpu, cuda, cuda:N")
    if args.stream_bytes <= args.config.context + 1:
        parser.error(f"--stream-bytes {args.stream_bytes}: must exceed context + 1 = "
                     f"{args.config.context + 1}")
    check_strict_flags(parser, args)
    return args


def init_distributed():
    """(rank, world_size); initializes gloo when WORLD_SIZE > 1."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return 0, 1
    import torch.distributed as dist
    for var in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        if var not in os.environ:
            sys.exit(f"torch_gpt_train: WORLD_SIZE={world_size} needs {var} in the environment")
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return rank, world_size


def decay_groups(model, weight_decay):
    """nanoGPT's groups: 2-D parameters decay, biases and LayerNorm parameters do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def setup_cuda(args, device):
    """Checks the device and sets the matmul modes: fp32 as ddp's cuBLAS sgemm, or TF32."""
    if not torch.cuda.is_available():
        sys.exit(f"torch_gpt_train: --device {args.device}: this PyTorch sees no CUDA device")
    if device.index is not None:
        torch.cuda.set_device(device)
    if args.precision == "bf16" and not torch.cuda.is_bf16_supported():
        sys.exit(f"torch_gpt_train: --precision bf16: {torch.cuda.get_device_name(device)} "
                 "has no bf16 support (it needs compute capability >= 8.0); use --precision fp32")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    if args.tf32:
        torch.backends.cudnn.allow_tf32 = True


def build_model(args, device, world_size):
    """(the module to train, its parameter count): Gpt, wrapped in DDP, then compiled."""
    model = torch_gpt.Gpt(args.config, sdpa=args.sdpa).init_weights(args.seed).to(device)
    parameters = sum(p.numel() for p in model.parameters())  # the tied wte once
    if world_size > 1:
        # The causal masks are bool buffers, equal on every rank; gloo cannot broadcast
        # bool ("Invalid scalar type"), so DDP is told to leave the buffers alone.
        torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            model, [name for name, _ in model.named_buffers()])
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    model.train()
    if args.compile:
        model = torch.compile(model)
    return model, parameters


def mfu(args, parameters, tokens_per_s, world_size):
    """llm.c's model FLOPs utilisation (the module docstring): 6N + 6LCT FLOPs a token."""
    config = args.config
    flops_per_token = 6 * parameters + 6 * config.layers * config.d_model * config.context
    return flops_per_token * tokens_per_s / (args.peak_tflops * 1e12 * world_size)


def make_step(args, model, optimizer, device, rank):
    """One training step on fresh windows of the rank's stream; returns the loss."""
    ctx = args.config.context
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    stream = torch.randint(0, args.config.vocab, (args.stream_bytes,), generator=gen).to(device)
    offsets = torch.arange(ctx + 1, device=device)

    def autocast():
        if args.precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step():
        starts = torch.randint(0, args.stream_bytes - ctx - 1, (args.batch, 1),
                               generator=gen).to(device)
        windows = stream[starts + offsets]  # [batch, ctx + 1]
        x, y = windows[:, :-1], windows[:, 1:]
        optimizer.zero_grad(set_to_none=True)  # PyTorch's default; bench gpt does the same
        with autocast():
            logits, _ = model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        loss.backward()
        if args.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        optimizer.step()
        return loss.item()

    return step


def result_row(args, device, world_size, elapsed, loss):
    """The JSON row's keys of every run (the module docstring)."""
    ctx = args.config.context
    tokens = args.steps * args.batch * ctx * world_size
    return {
        "impl": "torch",
        "model": args.model,
        "spec": torch_gpt.describe(args.config),
        "batch": args.batch,
        "context": ctx,
        "threads": args.threads,
        "device": str(device),
        "tokens_per_s": round(tokens / elapsed, 1),
        "step_ms": round(1e3 * elapsed / args.steps, 3),
        "steps": args.steps,
        "warmup": args.warmup,
        "world_size": world_size,
        "bucket_cap_mb": args.bucket_cap_mb,
        "last_loss": round(loss, 4),
        "torch": torch.__version__,
    }


def modes_row(args, device, world_size, parameters, tokens_per_s):
    """The keys the strict flags add to the row (the module docstring)."""
    row = {"precision": args.precision, "sdpa": args.sdpa, "compile": args.compile,
           "fused_adamw": args.fused_adamw, "tf32": args.tf32}
    if device.type == "cuda":
        row["peak_memory_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    if args.peak_tflops > 0:
        row["parameters"] = parameters
        row["mfu"] = round(mfu(args, parameters, tokens_per_s, world_size), 4)
    return row


PROFILE_TOP = 25


def profile_entries(prof, cuda):
    """(name, calls, ms) of each kernel (CUDA: device time) or aten op (CPU: self time).

    On CUDA a user annotation (record_function: "Optimizer.step#AdamW.step", compiled
    regions) also has a GPU-side span of device type CUDA covering its kernels
    (pytorch/pytorch#130730); it is left out, by is_user_annotation where torch has it
    and, for older torch, by its name also being a CPU-side entry's (a kernel's never is)."""
    from torch.autograd import DeviceType
    averages = prof.key_averages()
    cpu_names = {e.key for e in averages if getattr(e, "device_type", None) != DeviceType.CUDA}
    out = []
    for e in averages:
        if cuda:
            if getattr(e, "device_type", None) != DeviceType.CUDA:
                continue
            if getattr(e, "is_user_annotation", False) or e.key in cpu_names:
                continue
            us = (getattr(e, "self_device_time_total", None)
                  or getattr(e, "self_cuda_time_total", 0) or getattr(e, "device_time_total", 0))
        else:
            us = e.self_cpu_time_total
        if us > 0:
            out.append((e.key, e.count, us / 1e3))
    out.sort(key=lambda x: x[2], reverse=True)
    return out


def run_profile(args, step, device, rank):
    """--profile-steps: the rows of the longest entries (the module docstring). Every rank
    runs the profiled steps (their DDP collectives need each other); rank 0 reports."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(args.profile_steps):
            step()  # loss.item() waits for the device
        wall_ms = 1e3 * (time.perf_counter() - start)
    if rank != 0:
        return
    entries = profile_entries(prof, cuda)
    if not entries:
        print("torch_gpt_train.py: torch.profiler recorded no "
              f"{'kernels (is CUPTI available?)' if cuda else 'ops'}", file=sys.stderr)
    n = args.profile_steps
    step_ms = wall_ms / n

    def row(op, calls, ms):
        return {"impl": "torch", "section": "op profile", "op": op, "device": str(device),
                "calls_per_step": round(calls / n, 1), "ms_per_step": round(ms / n, 4),
                "share_of_step": round(ms / n / step_ms, 4)}

    rows = [row(name, calls, ms) for name, calls, ms in entries[:PROFILE_TOP]]
    rest = entries[PROFILE_TOP:]
    if rest:
        rows.append(row(f"(the other {len(rest)} entries)", sum(c for _, c, _ in rest),
                        sum(m for _, _, m in rest)))
    busy = sum(m for _, _, m in entries)
    rows.append(row("(every entry)", sum(c for _, c, _ in entries), busy))
    rows.append(row("(outside any entry)" if not cuda else "(the GPU idle)", 0, wall_ms - busy))
    rows.append(row("(the whole step)", 0, wall_ms))
    print(f"torch.profiler over {n} steps of {step_ms:.2f} ms ({'kernels, device time' if cuda else 'ops, self CPU time'}):",
          file=sys.stderr)
    for r in rows:
        print(f"  {r['ms_per_step']:10.3f} ms/step {100 * r['share_of_step']:5.1f}%  "
              f"{r['calls_per_step']:7.1f} calls  {r['op'][:110]}", file=sys.stderr)
    if args.profile_out:
        with open(args.profile_out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rank, world_size = init_distributed()
    device = torch.device(args.device)
    if device.type == "cuda":
        setup_cuda(args, device)
    model, parameters = build_model(args, device, world_size)
    fused = {"fused": True} if args.fused_adamw else {}
    optimizer = torch.optim.AdamW(decay_groups(model, args.weight_decay), lr=args.lr,
                                  betas=(0.9, 0.95), **fused)
    step = make_step(args, model, optimizer, device, rank)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.warmup):
        step()
    if world_size > 1:
        torch.distributed.barrier()
    loss = 0.0
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    elapsed = time.perf_counter() - start

    if rank == 0:
        row = result_row(args, device, world_size, elapsed, loss)
        if args.report_modes:
            row.update(modes_row(args, device, world_size, parameters, row["tokens_per_s"]))
        print(json.dumps(row), flush=True)
    if args.profile_steps > 0:
        try:  # the row above is the run's figure: a failed profile does not undo it
            run_profile(args, step, device, rank)
        except Exception as e:  # noqa: BLE001 (torch.profiler raises many kinds)
            print(f"torch_gpt_train.py: --profile-steps failed: {type(e).__name__}: {e}",
                  file=sys.stderr)
    if world_size > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
