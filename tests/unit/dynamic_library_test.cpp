// Libraries opened on first use (runtime/dynamic_library.h): a present library
// and its symbols, a missing library or symbol as a DeviceError that names it,
// where it was looked for and the fix; and, in a CUDA build, every cuBLAS and
// NCCL function ddp declares is found in the libraries this build uses (the
// programs link neither: a wrong name would otherwise first show on a GPU).
#include "runtime/dynamic_library.h"
#include "ddp/config.h"
#include "runtime/error.h"

#if DDP_HAVE_CUDA
#include "runtime/cuda/cublas_library.h"
#include "runtime/cuda/cublaslt_library.h"
#endif
#if DDP_HAVE_NCCL
#include "collectives/nccl_library.h"
#endif

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace ddp {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(DynamicLibrary, OpensALibraryAndFindsItsFunctions) {
  const DynamicLibrary zlib(
      LibrarySpec{.soname = "libz.so.1", .what = "zlib", .fallback_dirs = {}, .fix = "none"});
  using Version = const char* (*)();
  const auto version = zlib.function<Version>("zlibVersion");
  ASSERT_NE(version, nullptr);
  EXPECT_GT(std::strlen(version()), 0u);
  EXPECT_TRUE(contains(zlib.path(), "libz.so.1")) << zlib.path();
}

TEST(DynamicLibrary, MissingLibraryNamesItWhereItLookedAndTheFix) {
  try {
    DynamicLibrary lib(LibrarySpec{.soname = "libddp_absent.so.7",
                                   .what = "the absent library, which this test needs",
                                   .fallback_dirs = {"/nonexistent/lib64", ""},
                                   .fix = "Install the absent package"});
    FAIL() << "opened a library that does not exist";
  } catch (const DeviceError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m,
                         "cannot load libddp_absent.so.7, the absent library, which this test "
                         "needs: libddp_absent.so.7: cannot open shared object file"))
        << m;
    EXPECT_TRUE(contains(m,
                         "Looked in the loader's search path, "
                         "/nonexistent/lib64/libddp_absent.so.7 (LD_LIBRARY_PATH="))
        << m;
    EXPECT_TRUE(contains(m, "Install the absent package")) << m;
  }
}

TEST(DynamicLibrary, MissingSymbolSaysTheLibraryIsTooOld) {
  const DynamicLibrary zlib(
      LibrarySpec{.soname = "libz.so.1", .what = "zlib", .fallback_dirs = {}, .fix = "Update it"});
  try {
    zlib.symbol("zlibVersionFromTheFuture");
    FAIL() << "found a symbol that does not exist";
  } catch (const DeviceError& e) {
    const std::string m = e.what();
    EXPECT_TRUE(contains(m, "has no symbol zlibVersionFromTheFuture")) << m;
    EXPECT_TRUE(contains(m, "older than the version this build of ddp was compiled against")) << m;
    EXPECT_TRUE(contains(m, "Update it")) << m;
  }
}

TEST(VendorLibraries, CublasHasEveryFunctionDdpCalls) {
#if DDP_HAVE_CUDA
  const cuda_api::CublasLibrary& cublas = cuda_api::cublas();  // throws if one is missing
  EXPECT_NE(cublas.sgemm, nullptr);
  EXPECT_NE(cublas.gemm_ex, nullptr);
  EXPECT_NE(cublas.sgemm_strided_batched, nullptr);
  EXPECT_NE(cublas.gemm_strided_batched_ex, nullptr);
  EXPECT_STREQ(cublas.status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
#else
  GTEST_SKIP() << "this build has no CUDA";
#endif
}

TEST(VendorLibraries, CublasLtHasEveryFunctionDdpCalls) {
#if DDP_HAVE_CUDA
  const cuda_api::CublasLtLibrary& lt = cuda_api::cublaslt();  // throws if one is missing
  EXPECT_NE(lt.matmul, nullptr);
  EXPECT_NE(lt.heuristic, nullptr);
  EXPECT_STREQ(lt.status_name(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
#else
  GTEST_SKIP() << "this build has no CUDA";
#endif
}

// PyTorch's pip wheels bring the NVIDIA libraries under site-packages/nvidia/*/lib:
// the ones of an active virtual environment are searched, the package's own folder
// before the shared cu<N> one, after the caller's folders, each once.
TEST(DynamicLibrary, PythonWheelFoldersOfTheVirtualEnvironmentAreSearched) {
  namespace fs = std::filesystem;
  const fs::path venv = fs::temp_directory_path() / ("ddp_venv_" + std::to_string(getpid()));
  const fs::path site = venv / "lib" / "python3.11" / "site-packages" / "nvidia";
  fs::create_directories(site / "cudnn" / "lib");
  fs::create_directories(site / "cu13" / "lib");
  fs::create_directories(site / "nccl" / "lib");
  const char* old = std::getenv("VIRTUAL_ENV");
  const std::string saved = old != nullptr ? old : "";
  setenv("VIRTUAL_ENV", venv.c_str(), 1);
  const std::vector<std::string> dirs = python_wheel_library_dirs("cudnn", {"/first", "/first"});
  if (old != nullptr) {
    setenv("VIRTUAL_ENV", saved.c_str(), 1);
  } else {
    unsetenv("VIRTUAL_ENV");
  }
  fs::remove_all(venv);
  ASSERT_GE(dirs.size(), 3u);
  EXPECT_EQ(dirs[0], "/first");
  EXPECT_EQ(dirs[1], "/first");  // the caller's list is kept as given
  EXPECT_EQ(dirs[2], (site / "cudnn" / "lib").string());
  EXPECT_EQ(dirs[3], (site / "cu13" / "lib").string());
  for (const std::string& d : dirs) EXPECT_FALSE(contains(d, "nccl")) << d;
}

TEST(VendorLibraries, NcclHasEveryFunctionDdpCalls) {
#if DDP_HAVE_NCCL
  const nccl::Library& lib = nccl::library();  // throws if one is missing
  int version = 0;
  ASSERT_EQ(lib.get_version(&version), ncclSuccess);
  EXPECT_GE(version, NCCL_VERSION(2, 0, 0)) << "NCCL " << version;
  EXPECT_STRNE(lib.get_error_string(ncclSystemError), "");
#else
  GTEST_SKIP() << "this build has no NCCL";
#endif
}

}  // namespace
}  // namespace ddp
