// A shared library opened with dlopen on first use.
//
// Note [vendor libraries on first use]: the programs link the CUDA runtime
// statically and open cuBLAS (libcublas.so.N) and NCCL (libnccl.so.2) only when
// a matmul on a GPU or an nccl communicator needs them. So `ddprun` and
// `train --device cpu` start on a machine without any CUDA library, and a
// machine whose CUDA libraries are missing or of another major version gets a
// DeviceError naming the library, where it was looked for and the fix, instead
// of the loader's "error while loading shared libraries" before main().
// A library opened here stays open until the process exits (closing cuBLAS or
// NCCL while their threads or exit handlers may still run is not worth the risk).
#pragma once

#include <string>
#include <vector>

namespace ddp {

struct LibrarySpec {
  std::string soname;  // "libcublas.so.13": the name the loader searches for
  std::string what;    // what it is and what needs it: "cuBLAS (matmul on CUDA devices)"
  // Searched after the loader's own path (LD_LIBRARY_PATH, the program's RUNPATH,
  // /etc/ld.so.cache): e.g. where the build found the library.
  std::vector<std::string> fallback_dirs;
  std::string fix;  // the last sentence of the error: how to get the library
};

// `first` followed by the lib folders of the NVIDIA Python wheels that may hold a
// library (PyTorch's pip wheels bring cuBLAS, cuDNN and NCCL as nvidia-<package>-cuXX):
// nvidia/<package>/lib and nvidia/cu<N>/lib under the site-packages and dist-packages
// of $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local, /usr/local, /usr and /opt/conda, the ones
// that exist, in that order.
std::vector<std::string> python_wheel_library_dirs(const std::string& package,
                                                   std::vector<std::string> first = {});

class DynamicLibrary {
 public:
  // Opens the library; throws DeviceError naming it, every place tried, the
  // loader's reason and spec.fix.
  explicit DynamicLibrary(LibrarySpec spec);
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  // The address of an exported symbol; throws DeviceError when the library lacks
  // it (an older version than the one this build was compiled against).
  void* symbol(const char* name) const;
  template <typename Fn>
  Fn function(const char* name) const {
    return reinterpret_cast<Fn>(symbol(name));
  }
  const std::string& path() const { return path_; }  // the file that was opened

 private:
  LibrarySpec spec_;
  void* handle_ = nullptr;
  std::string path_;
};

}  // namespace ddp
