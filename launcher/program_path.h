// Finding PROGRAM the way `ddprun -n 4 train` expects from any directory.
#pragma once

#include <string>
#include <vector>

namespace ddp::launcher {

struct ProgramLookup {
  std::string path;   // what to exec; empty when not found
  std::string error;  // why not, with what was tried (when path is empty)
  int exit_code = 0;  // 127 not found, 126 found but not executable (as a shell)
  // A Python script: path is python3, and these come before the program's own
  // arguments ("-u", the script), as torchrun runs a .py (unbuffered output).
  std::vector<std::string> interpreter_args;
};

// PROGRAM ending in ".py" that is a file (a path, or relative to the current
// directory) runs under python3 from `path_env` (torchrun's behaviour). Otherwise
// PROGRAM containing '/' is a path, used as is; else, in order: a file next to
// ddprun (in `self_dir`), then the directories of `path_env` (PATH). Only regular
// files that this user may execute count.
// `how`: torchrun's -m (PROGRAM is a module: python3 -u -m PROGRAM) and --no-python
// (a .py is executed itself, as any program).
// `python_exec`: torchrun's PYTHON_EXEC, the interpreter of a .py or a module (a
// path, or a name found on `path_env`); empty: python3 from `path_env`.
enum class ProgramKind { as_found, module, no_python };
ProgramLookup find_program(const std::string& program, const std::string& self_dir,
                           const std::string& path_env, ProgramKind how = ProgramKind::as_found,
                           const std::string& python_exec = "");

// The directory of the running executable (/proc/self/exe), "" when unknown.
std::string self_exe_dir();

}  // namespace ddp::launcher
