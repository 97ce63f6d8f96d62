#include "launcher/program_path.h"

#include <sys/stat.h>
#include <unistd.h>
#include "runtime/fmt.h"

#include <filesystem>
#include <sstream>

namespace ddp::launcher {
namespace {

bool is_regular(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_executable(const std::string& path) {
  return is_regular(path) && ::access(path.c_str(), X_OK) == 0;
}

ProgramLookup found(std::string path) {
  ProgramLookup out;
  out.path = std::move(path);
  return out;
}

ProgramLookup not_found(int exit_code, std::string error) {
  ProgramLookup out;
  out.exit_code = exit_code;
  out.error = std::move(error);
  return out;
}

// The first executable `name` in the directories of path_env, or "".
std::string on_path(const std::string& name, const std::string& path_env) {
  std::stringstream dirs(path_env);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (is_executable(candidate)) return candidate;
  }
  return "";
}

}  // namespace

ProgramLookup find_program(const std::string& program, const std::string& self_dir,
                           const std::string& path_env, ProgramKind how,
                           const std::string& python_exec) {
  // The interpreter, as torchrun's: PYTHON_EXEC if set, else python3 on PATH.
  const std::string interpreter = python_exec.empty() ? "python3" : python_exec;
  const std::string python = interpreter.find('/') != std::string::npos
                                 ? (is_executable(interpreter) ? interpreter : "")
                                 : on_path(interpreter, path_env);
  const std::string no_python_why =
      python_exec.empty()
          ? fmt::format("python3 is not on PATH ({})", path_env)
          : fmt::format("PYTHON_EXEC={} is not an executable{}", python_exec,
                        python_exec.find('/') != std::string::npos ? "" : " on PATH");
  if (how == ProgramKind::module) {
    if (program.find('/') != std::string::npos || program.ends_with(".py")) {
      return not_found(2, fmt::format("-m {}: expected a module name (pkg.train), not a file; "
                                      "drop -m to run a script",
                                      program));
    }
    if (python.empty()) return not_found(127, fmt::format("-m {}: {}", program, no_python_why));
    ProgramLookup out = found(python);
    out.interpreter_args = {"-u", "-m", program};
    return out;
  }
  if (how == ProgramKind::as_found && program.ends_with(".py") && is_regular(program)) {
    if (python.empty()) {
      return not_found(127, fmt::format("'{}' is a Python script, and {}", program, no_python_why));
    }
    ProgramLookup out = found(python);
    out.interpreter_args = {"-u", program};
    return out;
  }
  if (program.find('/') != std::string::npos) {
    if (is_executable(program)) return found(program);
    if (is_regular(program)) {
      return not_found(126, fmt::format("'{}' is not executable (chmod +x it?)", program));
    }
    return not_found(127, fmt::format("'{}': no such file", program));
  }
  if (!self_dir.empty() && is_executable(self_dir + "/" + program)) {
    return found(self_dir + "/" + program);
  }
  if (std::string candidate = on_path(program, path_env); !candidate.empty()) {
    return found(candidate);
  }
  if (how == ProgramKind::no_python && program.ends_with(".py")) {
    return not_found(127, fmt::format("--no-python runs '{}' itself, and there is no such "
                                      "program on PATH; pass its path (./{}), executable (chmod "
                                      "+x) with a #! line, or drop --no-python to run it with {}",
                                      program, program, interpreter));
  }
  return not_found(
      127,
      fmt::format("program '{}' not found: not next to ddprun ({}) and not on PATH; pass its "
                  "path (./{}) or put its folder on PATH (in a source checkout: cmake "
                  "--build build --target {})",
                  program, self_dir.empty() ? "unknown directory" : self_dir, program, program));
}

std::string self_exe_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

}  // namespace ddp::launcher
