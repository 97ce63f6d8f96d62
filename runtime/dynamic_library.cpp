#include "runtime/dynamic_library.h"

#include "runtime/error.h"

#include <fmt/ranges.h>

#include <dlfcn.h>
#include <glob.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>

namespace ddp {
namespace {

std::string last_dl_error() {
  const char* e = dlerror();
  return e != nullptr ? e : "unknown dlerror";
}

// The file the loader picked for `handle` (its search may have found it anywhere).
std::string loaded_path(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr &&
      map->l_name[0] != '\0') {
    return map->l_name;
  }
  return fallback;
}

// The paths matching a glob(3) pattern, sorted (none when nothing matches).
std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), GLOB_ONLYDIR, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  return out;
}

}  // namespace

std::vector<std::string> python_wheel_library_dirs(const std::string& package,
                                                   std::vector<std::string> first) {
  std::vector<std::string> prefixes;
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && v[0] != '\0') prefixes.emplace_back(v);
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    prefixes.push_back(std::string(home) + "/.local");
  }
  for (const char* p : {"/usr/local", "/usr", "/opt/conda"}) prefixes.emplace_back(p);
  std::vector<std::string> dirs = std::move(first);
  const auto add = [&dirs](const std::string& dir) {
    if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
  };
  for (const std::string& prefix : prefixes) {
    for (const char* site : {"site-packages", "dist-packages"}) {
      for (const std::string& pkg : {package, std::string("cu[0-9]*")}) {
        for (const std::string& dir :
             glob_paths(prefix + "/lib/python3*/" + site + "/nvidia/" + pkg + "/lib")) {
          add(dir);
        }
      }
    }
  }
  for (const std::string& dir :
       glob_paths("/usr/lib/python3/dist-packages/nvidia/" + package + "/lib")) {
    add(dir);
  }
  return dirs;
}

DynamicLibrary::DynamicLibrary(LibrarySpec spec) : spec_(std::move(spec)) {
  std::vector<std::string> tried;
  std::string reason;  // the loader's, for the soname; a fallback's only when it is not "missing"
  std::vector<std::string> candidates = {spec_.soname};
  for (const std::string& dir : spec_.fallback_dirs) {
    if (!dir.empty()) candidates.push_back(dir + "/" + spec_.soname);
  }
  for (const std::string& candidate : candidates) {
    handle_ = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) {
      path_ = loaded_path(handle_, candidate);
      return;
    }
    const std::string why = last_dl_error();
    if (candidate == spec_.soname) {
      tried.push_back("the loader's search path");
      reason = why;
    } else {
      tried.push_back(candidate);
      if (why.find("No such file") == std::string::npos) reason += "; " + why;
    }
  }
  const char* ld_path = std::getenv("LD_LIBRARY_PATH");
  throw DeviceError(fmt::format("cannot load {}, {}: {}. Looked in {} (LD_LIBRARY_PATH={}). {}",
                                spec_.soname, spec_.what, reason, fmt::join(tried, ", "),
                                ld_path != nullptr ? ld_path : "(unset)", spec_.fix));
}

void* DynamicLibrary::symbol(const char* name) const {
  (void)dlerror();
  void* address = dlsym(handle_, name);
  if (address == nullptr) {
    throw DeviceError(
        fmt::format("{} ({}) has no symbol {}: {}. It is older than the version this "
                    "build of ddp was compiled against; {}",
                    path_, spec_.what, name, last_dl_error(), spec_.fix));
  }
  return address;
}

}  // namespace ddp
