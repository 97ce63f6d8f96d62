// mpi_allreduce_ref: Open MPI's own blocking MPI_Allreduce, timed like `bench
// allreduce` (the reference of the collectives benchmarks). Run under mpirun.
//   mpi_allreduce_ref [--min-bytes N] [--max-bytes N] [--iters N]
// Rank 0 prints one JSON line per size: bytes, time_us, algbw_gbps, busbw_gbps,
// backend ("openmpi-ref"), world_size.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

long long arg_value(int argc, char** argv, const char* flag, long long fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], flag) == 0) return std::atoll(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::puts(
          "usage: mpirun -np N mpi_allreduce_ref [--min-bytes N] [--max-bytes N] [--iters N]");
      return 0;
    }
  }
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const long long min_bytes = std::max(4LL, arg_value(argc, argv, "--min-bytes", 4));
  const long long max_bytes = arg_value(argc, argv, "--max-bytes", 256LL << 20);
  const long long fixed_iters = arg_value(argc, argv, "--iters", 0);
  for (long long bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
    const int count = static_cast<int>(bytes / 4);
    std::vector<float> in(static_cast<size_t>(count), static_cast<float>(rank + 1)), out(in.size());
    const long long iters =
        fixed_iters > 0 ? fixed_iters : std::clamp(200000000LL / bytes, 5LL, 1000LL);
    for (int i = 0; i < 3; ++i) {
      MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (long long i = 0; i < iters; ++i) {
      MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    double us = (MPI_Wtime() - start) / static_cast<double>(iters) * 1e6, slowest = 0;
    MPI_Reduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    const bool ok = out.empty() || out[0] == static_cast<float>(n * (n + 1) / 2);
    if (rank == 0) {
      const double algbw = static_cast<double>(count) * 4 / (slowest * 1e3);
      std::printf(
          "{\"bytes\": %lld, \"time_us\": %.2f, \"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, "
          "\"check\": \"%s\", \"backend\": \"openmpi-ref\", \"world_size\": %d}\n",
          static_cast<long long>(count) * 4, slowest, algbw, algbw * 2.0 * (n - 1) / n,
          ok ? "ok" : "FAIL", n);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
