// bench: measurements of the ddp runtime. `bench --help` lists the subcommands.
//
// Exit codes: 0 success, 1 a measurement or its correctness check failed,
// 2 a usage error (unknown subcommand or flag, bad flag value, unavailable device).
#include "bench/subcommands.h"

#include "runtime/error.h"
#include "runtime/trace.h"

#include "runtime/fmt.h"

#include <array>
#include <charconv>
#include <exception>
#include <iostream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::bench {
namespace {

// Note [bench registry]: one line per subcommand; the help, the dispatch and the
// "valid subcommands" list of the usage errors all come from this table.
constexpr std::array kSubcommands = {
    Subcommand{
        "device", "host/device data movement, rand and allocation speed",
        "Measures, on a CUDA device:\n"
        "  1. rand of a 10000x10000 f32 tensor made on the host and copied (.to(cuda))\n"
        "     vs made on the device directly: ms and speedup;\n"
        "  2. host-to-device and device-to-host bandwidth, pageable vs pinned host\n"
        "     memory, for 1 MiB, 16 MiB and 256 MiB (GB/s);\n"
        "  3. ddp::empty (the caching allocator) vs raw cudaMalloc/cudaFree for 1 MiB\n"
        "     and 64 MiB: microseconds per allocate+free pair.\n"
        "On the CPU (no GPU, or --device cpu): rand 10000x10000 (ms, GB/s written),\n"
        "memcpy bandwidth as the physical reference next to ddp::copy_, and ddp::empty\n"
        "vs std::aligned_alloc/free for 1 MiB and 64 MiB.\n"
        "On both, the memory-bound kernels of a bf16 GPT step (fill, cast, the residual\n"
        "add's f32 + bf16, axpy, gelu and its backward over 64M elements; layer_norm and\n"
        "the fused residual add + layer_norm over [65536, 768]; the cross-entropy over\n"
        "[8192, 50257] bf16 logits and its backward; a sixteenth of each on the CPU):\n"
        "bytes read + written per second (each input read once, each output written\n"
        "once) and the fraction of a copy's on the same device.\n"
        "Defaults: rand 1 warmup + 3 repeats on the host (2 + 10 on a GPU); copies and\n"
        "allocations 2 warmups + 20 repeats, each repeat at least 5 ms of back-to-back calls;\n"
        "kernels 2 warmups + 20 repeats (5 on the CPU), each at least 5 ms of calls.",
        run_device_bench},
    Subcommand{"gemm",
               "GEMM GFLOP/s of ddp::matmul_out next to bare BLAS (cblas_sgemm / cublasSgemm)",
               "GFLOP/s (2*m*n*k / time) for the MLP's shapes: forward 64x784 by 784x256,\n"
               "weight gradient [64,256]^T by [64,784] (trans_a), output 64x256 by 256x10,\n"
               "the CNN's classifier, gpt-mini's projections and 2048x2048x2048. Each shape\n"
               "runs ddp::matmul_out into a preallocated output next to the bare vendor call\n"
               "(cblas_sgemm, cublasSgemm) on the same buffers, samples interleaved, and\n"
               "reports both and our overhead in percent ((t_ours/t_bare - 1)*100, target\n"
               "< 5%); ours_lib names the library ddp chose (on the CPU oneDNN's sgemm for\n"
               "wide shapes when the build has it: negative overhead is its lead). On a GPU\n"
               "also bf16 via ddp::matmul. Inputs are ddp::rand with fixed seeds; ours and\n"
               "bare are checked to agree (max relative error < 1e-4) before timing, else the\n"
               "run fails with exit code 1. The error against a float64 reference on sampled\n"
               "entries is reported too.\n"
               "Defaults: 2 warmups + 25 repeats, each repeat at least 5 ms of back-to-back calls.",
               run_gemm_bench},
    Subcommand{
        "allreduce", "all_reduce latency and bandwidth over ranks (nccl-tests columns)",
        "Run it under a launcher: `ddprun -n 4 bench allreduce`, or\n"
        "`mpirun -np 4 bench allreduce` (alone it is one rank). For each size from\n"
        "--min-bytes to --max-bytes (doubling): all_reduce(sum) of a tensor, timed\n"
        "over --iters iterations after --warmup ones (the slowest rank's time), with\n"
        "algbw = bytes / time and busbw = algbw * 2 (n - 1) / n as nccl-tests defines\n"
        "them, then a correctness check (rank r contributes r + 1: every element must\n"
        "be n (n + 1) / 2). Rank 0 prints one row per size.\n"
        "  --min-bytes N   smallest size (default 4)\n"
        "  --max-bytes N   largest size (default 268435456 = 256 MiB)\n"
        "  --iters N       timed iterations per size (default: about 0.2 s per size,\n"
        "                  5 to 1000)\n"
        "  --dtype D       f32, bf16, f16, i32, i64 (default f32)\n"
        "  --backend B     auto, local, shm, gloo, mpi, nccl (default: DDP_BACKEND or auto)\n"
        "JSON rows: bytes, count, dtype, time_us, algbw_gbps, busbw_gbps, check, backend,\n"
        "world_size.",
        run_allreduce_bench, "--min-bytes --max-bytes --iters --dtype --backend"},
    Subcommand{"train", "a training step of `train`, split into phases, alone or under a launcher",
               "Runs `train` (models/train) for --warmup epochs (default 1) and then --repeats\n"
               "epochs (default 3) of --steps steps each, constant lr, and reports the median\n"
               "epoch: global samples/s and tokens/s, ms per optimizer step, and the step split\n"
               "into data, forward, backward (autograd with DDP's hooks and bucket launches),\n"
               "exposed communication (DDP: waiting for the all_reduces after backward),\n"
               "optimizer; comm_ms is the backend's time running the all_reduces, hidden or not,\n"
               "and overlap = 1 - exposed / comm. On CUDA the phases are separated by device\n"
               "synchronizations. Run it under ddprun/mpirun for DDP (`ddprun -n 2 bench train`),\n"
               "alone for one device, or with --mode ddp alone for DDP over one rank.\n"
               "A gpt model trains with train's recipe for it (docs/train.md: AdamW, clipping at\n"
               "1.0) on the Brown corpus ($DDP_BROWN_DIR, else /usr/share/datasets/brown) unless\n"
               "--data is given; a sample is a sequence of the model's context, and each of its\n"
               "evaluations reads one validation batch (--eval-batches 1), outside the timing.\n"
               "  --model M           mlp, cnn, gpt-tiny, gpt-mini, gpt2 or\n"
               "                      gpt:layers=..,d=..,heads=..,ctx=.. (default mlp)\n"
               "  --hidden N[,N]      mlp sizes (default 256)\n"
               "  --batch-size N      per rank (default 64; gpt: sequences)\n"
               "  --steps N           steps per epoch (default 300)\n"
               "  --mode M            auto|single|ddp|dp (default auto)   --devices D,D  for dp\n"
               "  --bucket-cap-mb X   DDP bucket cap (default 25)\n"
               "  --comm-hook H       none|bf16|fp16 (default none)\n"
               "  --grad-accum K      micro-batches per step (default 1)\n"
               "  --data DIR|synthetic (default Fashion-MNIST when installed, else synthetic;\n"
               "                      gpt: the Brown corpus, as above)\n"
               "JSON rows: model, mode, world, batch, bucket_mb, hook, samples_per_s,\n"
               "tokens_per_s, step_ms, data_ms, forward_ms, backward_ms, exposed_ms,\n"
               "optimizer_ms, comm_ms, overlap, exposed_pct, steps, device. tokens_per_s is\n"
               "samples_per_s times the gpt model's context (mlp, cnn: equal to samples_per_s).",
               run_train_bench,
               "--model --hidden --batch-size --steps --mode --devices --bucket-cap-mb --comm-hook "
               "--grad-accum --data"},
    Subcommand{
        "gpt", "a GPT training step on one device: phases, GEMM GFLOP/s, peak memory",
        "Builds the GPT model (models/gpt.h) from seed 1234 and times --warmup (default 2)\n"
        "then --repeats (default 10) training steps on fixed pseudo-random tokens:\n"
        "forward with the loss, backward, gradient-norm clipping at 1.0, AdamW (nanoGPT's\n"
        "decay groups). Reports the median step: tokens/s, ms per phase, the step's GEMM\n"
        "GFLOP (three times the forward's projections, attention products and tied head)\n"
        "and GFLOP/s, and the process's peak resident memory (getrusage), model, gradients,\n"
        "AdamW state and activations included; on CUDA also the device's peak allocated\n"
        "memory. Threads: OPENBLAS_NUM_THREADS.\n"
        "  --model M          gpt-tiny, gpt-mini, gpt2 or gpt:layers=..,d=..,heads=..,ctx=..\n"
        "                     (default gpt-mini)\n"
        "  --batch-size N     sequences of the model's context per step (default 8)\n"
        "  --precision P      fp32 (default) or bf16: the forward and loss under autocast\n"
        "                     (CUDA: mixed precision as `train --precision bf16`; the CPU\n"
        "                     runs the same rules through f32 kernels, a reference only)\n"
        "  --peak-tflops X    the device's dense peak: adds mfu, llm.c's count (6 N + 6 L C T\n"
        "                     FLOPs per token, N every parameter) over X (default 0: none)\n"
        "  --ops yes          then time each kind of op of the step alone, forward +\n"
        "                     backward, at the model's shapes and precision, times how often\n"
        "                     a step runs it: where the step's time goes (default no)\n"
        "  --cuda-graph yes   CUDA: after the warm-up steps, capture one step in a CUDA\n"
        "                     graph (as train --cuda-graph, docs/cuda_graphs.md) and time\n"
        "                     its replays; forward_ms is then the whole step (default no)\n"
        "  --profile-steps N  then run N more steps under the op profile (docs/profile.md):\n"
        "                     each op's time inside the real step, by op and shapes, and\n"
        "                     the time outside any op (default 0: none)\n"
        "JSON rows: model, parameters, batch, precision, cuda_graph, tokens_per_s, step_ms,\n"
        "forward_ms, backward_ms, clip_ms, optimizer_ms, gemm_gflop, gflops, model_tflops,\n"
        "mfu (with --peak-tflops), peak_rss_mib, peak_device_mib, peak_reserved_mib and\n"
        "raw_allocs_timed (CUDA: the cudaMallocs of the timed steps), device; with --ops yes one\n"
        "row per op: op, per_step, ms_each, ms_per_step, share_of_forward_backward; with\n"
        "--profile-steps one row per profiled entry: op, device, shapes, calls_per_step,\n"
        "ms_per_step, share_of_step.",
        run_gpt_bench,
        "--model --batch-size --precision --peak-tflops --ops --cuda-graph --profile-steps"},
    Subcommand{"join", "what a Join adds to a DDP step when no rank has run out (its count)",
               "Run it under a launcher: `ddprun -n 2 bench join`. Trains the mlp 784-256-10\n"
               "(batch 64 per rank, SGD, gradient_as_bucket_view as train) in rounds of --steps\n"
               "steps, alternately plain and under a Join (collectives/ddp/join.h) that no rank\n"
               "leaves: the difference is the Join's count all_reduce per step (Note [join]).\n"
               "Reports the median per-step time of each over --repeats rounds (default 40,\n"
               "after --warmup 2), the median of the paired differences, and the count's\n"
               "all_reduce alone (world-size i64 slots, 2000 iterations).\n"
               "  --steps N   steps per round (default 50)\n"
               "JSON rows: world, backend, plain_us, join_us, diff_us, diff_pct,\n"
               "count_allreduce_us, rounds, steps, device.",
               run_join_bench, "--steps"},
    Subcommand{"elastic", "what ddprun --on-failure continue adds to a step without a failure",
               "One process, part by part (docs/elastic.md): check_membership() when no poll\n"
               "is due (a clock read), a due poll of the membership (elastic::latest_epoch over\n"
               "TCP to a store server in this process, a membership published: what each rank\n"
               "does every 100 ms), and a --loss-log row flushed to its file (continue) next to\n"
               "a buffered one (restart), interleaved. Then the sum for one step of --step-ms:\n"
               "the clock read and the flush's extra on every step, the poll on one step in\n"
               "max(1, 100 ms / step). bench/elastic.sh compares whole jobs.\n"
               "  --step-ms MS  the step time the total is for (default 3.5: the mlp at 4 ranks\n"
               "                on 2 cores, docs/benchmarks.md)\n"
               "Defaults: 15 repeats of at least 20 ms of back-to-back calls each.\n"
               "JSON rows: part, us, per_step, restart_us, overhead_pct.",
               run_elastic_bench, "--step-ms"},
    Subcommand{"flight", "what the flight recorder adds to each collective (ns)",
               "One process: the five moments of a collective its caller waits for, told\n"
               "to no observer, to one that does nothing (the events framework's share)\n"
               "and to a flight recorder of 2000 records (samples interleaved; each\n"
               "sample 1000 collectives, at least 20 ms). Reports the\n"
               "minimum and median ns per collective; the difference is the recorder's cost\n"
               "(docs/flight_recorder.md compares it with a 4 KiB shm all_reduce).\n"
               "JSON rows: observers, ns_per_collective, median_ns.",
               run_flight_bench},
    Subcommand{"trace", "what the timeline (DDP_TRACE) costs per recorded event, on the host",
               "Times, next to an empty loop of the same length: a trace::Span with tracing\n"
               "off and on (begin + end records), Phases::next, an instant, and a collective's\n"
               "five moments (enqueued, started, completed, wait_begin, wait_end) through the\n"
               "timeline's observer, on and off (off: no observer, what a run without\n"
               "DDP_TRACE pays); then writing a rank file of 100000 records.\n"
               "ns_over_loop is the cost above the empty loop.\n"
               "Then a DDP training step as train takes it (the step span, its phases, DDP's\n"
               "and the collectives' records) with tracing off and on in one process,\n"
               "alternating every --steps steps for --rounds rounds; under ddprun every rank\n"
               "toggles at the same step (`ddprun -n 2 bench trace`). The overhead is the\n"
               "median of each round's on/off ratio, of the wall time and of the process's\n"
               "CPU time (all threads; not counting other processes' use of the cores).\n"
               "docs/observability.md, \"Overhead\".\n"
               "  --model M       mlp (784-256-10, batch 64, SGD) or a gpt (gpt-mini: batch\n"
               "                  2 x 256 tokens, AdamW) (default mlp)\n"
               "  --steps N       steps per block (default 20; gpt 1)\n"
               "  --rounds N      off/on rounds (default 15; gpt 3)\n"
               "Defaults: 1 warmup + 15 repeats of 10000 operations (2000 collectives).\n"
               "JSON rows: what, ns_per_op, ns_over_loop, ops_per_sample, repeats; records,\n"
               "write_ms, bytes, ns_per_record; model, world, backend, rounds, steps,\n"
               "off_step_ms, on_step_ms, overhead_pct, off_cpu_ms, on_cpu_ms, cpu_overhead_pct,\n"
               "records_per_step.",
               run_trace_bench, "--model --steps --rounds"},
};

constexpr std::string_view kFlagsHelp =
    "flags:\n"
    "  --device cpu|cuda:N  device to measure (default: ddp::default_device(): cuda:0 when\n"
    "                       a GPU is usable, else cpu; the DDP_DEVICE variable overrides)\n"
    "  --repeats N          timed repeats per measurement, N >= 1 (default: per measurement)\n"
    "  --warmup N           untimed runs before timing, N >= 0 (default: per measurement)\n"
    "  --json               one JSON object per result row on stdout and nothing else;\n"
    "                       progress and errors go to stderr\n"
    "  --help, -h           this help\n"
    "Flags may also be written --flag=value. Exit codes: 0 ok, 1 a check or the\n"
    "runtime failed, 2 usage error.\n";

std::string subcommand_names() {
  std::string names;
  for (const auto& sub : kSubcommands) names += (names.empty() ? "" : ", ") + std::string(sub.name);
  return names;
}

void print_main_help(std::ostream& os) {
  os << "usage: bench <subcommand> [flags]\n\nMeasurements of the ddp runtime.\n\nsubcommands:\n";
  for (const auto& sub : kSubcommands) os << fmt::format("  {:<10} {}\n", sub.name, sub.summary);
  os << "\n" << kFlagsHelp << "\n`bench <subcommand> --help` describes one subcommand.\n";
}

void print_sub_help(std::ostream& os, const Subcommand& sub) {
  os << "usage: bench " << sub.name << " [flags]\n\n" << sub.help << "\n\n" << kFlagsHelp;
}

const Subcommand* find_subcommand(std::string_view name) {
  for (const auto& sub : kSubcommands) {
    if (sub.name == name) return &sub;
  }
  return nullptr;
}

struct UsageError {
  std::string message;
};

int parse_count(std::string_view flag, std::string_view text, int minimum) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < minimum) {
    throw UsageError{fmt::format("{} expects an integer >= {}, got '{}'", flag, minimum, text)};
  }
  return value;
}

struct Command {
  const Subcommand* sub = nullptr;
  bool help = false;
  bool json = false;
  std::optional<std::string> device;
  std::optional<int> repeats, warmup;
  std::map<std::string, std::string, std::less<>> extra;
};

// True when `flag` is one of the subcommand's own flags.
bool is_sub_flag(const Subcommand* sub, std::string_view flag) {
  if (sub == nullptr) return false;
  std::string_view list = sub->flags;
  while (!list.empty()) {
    const size_t space = list.find(' ');
    if (list.substr(0, space) == flag) return true;
    if (space == std::string_view::npos) break;
    list.remove_prefix(space + 1);
  }
  return false;
}

Command parse_args(const std::vector<std::string_view>& args) {
  Command cmd;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (!arg.starts_with("-")) {
      if (cmd.sub != nullptr) {
        throw UsageError{
            fmt::format("unexpected argument '{}' after subcommand '{}'", arg, cmd.sub->name)};
      }
      cmd.sub = find_subcommand(arg);
      if (cmd.sub == nullptr) {
        throw UsageError{
            fmt::format("unknown subcommand '{}'; valid subcommands: {}", arg, subcommand_names())};
      }
      continue;
    }
    std::string_view flag = arg;
    std::optional<std::string_view> inline_value;
    if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
      flag = arg.substr(0, eq);
      inline_value = arg.substr(eq + 1);
    }
    auto value = [&]() -> std::string_view {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) throw UsageError{fmt::format("{} needs a value", flag)};
      return args[++i];
    };
    if (flag == "--help" || flag == "-h") {
      cmd.help = true;
    } else if (flag == "--json") {
      cmd.json = true;
    } else if (flag == "--device") {
      cmd.device = std::string(value());
    } else if (flag == "--repeats") {
      cmd.repeats = parse_count(flag, value(), 1);
    } else if (flag == "--warmup") {
      cmd.warmup = parse_count(flag, value(), 0);
    } else if (is_sub_flag(cmd.sub, flag)) {
      cmd.extra[std::string(flag)] = std::string(value());
    } else {
      throw UsageError{
          fmt::format("unknown flag '{}'; valid flags: --device, --repeats, --warmup, "
                      "--json, --help{}{}",
                      flag, cmd.sub != nullptr && !cmd.sub->flags.empty() ? ", " : "",
                      cmd.sub != nullptr ? cmd.sub->flags : "")};
    }
  }
  return cmd;
}

// The device named by --device (or the default), checked to be available.
Device resolve_device(const std::optional<std::string>& text) {
  try {
    const Device device = text ? Device::parse(*text) : default_device();
    check_available(device);
    return device;
  } catch (const Error& e) {
    throw UsageError{fmt::format("--device: {}", e.what())};
  }
}

int run(const std::vector<std::string_view>& args) {
  Command cmd;
  try {
    cmd = parse_args(args);
    if (cmd.help) {
      cmd.sub != nullptr ? print_sub_help(std::cout, *cmd.sub) : print_main_help(std::cout);
      return 0;
    }
    if (cmd.sub == nullptr) {
      throw UsageError{
          fmt::format("no subcommand given; valid subcommands: {}", subcommand_names())};
    }
    BenchOptions options{.device = resolve_device(cmd.device),
                         .json = cmd.json,
                         .repeats = cmd.repeats,
                         .warmup = cmd.warmup,
                         .extra = cmd.extra};
    const Reporter reporter(std::string(cmd.sub->name), options.json);
    return cmd.sub->run(options, reporter);
  } catch (const UsageError& e) {
    std::cerr << "bench: " << e.message << "\n(run `bench --help` for usage)\n";
    return 2;
  } catch (const SubcommandUsageError& e) {
    std::cerr << "bench " << cmd.sub->name << ": " << e.what() << "\n(run `bench " << cmd.sub->name
              << " --help` for usage)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "bench " << (cmd.sub != nullptr ? cmd.sub->name : "") << ": error: " << e.what()
              << "\n";
    return 1;
  }
}

}  // namespace
}  // namespace ddp::bench

int main(int argc, char** argv) {
  ddp::trace::start_from_env();  // DDP_TRACE=DIR (docs/observability.md)
  std::vector<std::string_view> args(argv + 1, argv + argc);
  return ddp::bench::run(args);
}
