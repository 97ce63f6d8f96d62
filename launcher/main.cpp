// ddprun: the launcher of ddp (its torchrun). See --help and docs/ddprun.md.
#include "ddp/config.h"
#include "launcher/agent.h"
#include "launcher/analyze.h"
#include "launcher/options.h"
#include "launcher/process.h"
#include "launcher/program_path.h"
#include "launcher/trace_merge_cli.h"
#include "runtime/env.h"
#include "runtime/error.h"
#include "runtime/logging.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace {

// Ranks get our fds 0-2 re-pointed; make sure they exist, so that no pipe of
// ours lands on 0, 1 or 2 when ddprun was started with one closed.
void ensure_standard_fds() {
  for (;;) {
    const int fd = ::open("/dev/null", O_RDWR);
    if (fd < 0) return;
    if (fd > STDERR_FILENO) {
      ::close(fd);
      return;
    }
  }
}

// An Error from deep in the agent may start with "ddprun: " already.
std::string_view without_prefix(std::string_view what) {
  constexpr std::string_view kPrefix = "ddprun: ";
  if (what.starts_with(kPrefix)) what.remove_prefix(kPrefix.size());
  return what;
}

}  // namespace

int main(int argc, char** argv) {
  ensure_standard_fds();
  // Subcommands (a program named like one runs as `ddprun -- analyze`).
  if (argc >= 2 && std::string_view(argv[1]) == "analyze") {
    return ddp::launcher::run_analyze(std::vector<std::string>(argv + 2, argv + argc), std::cout,
                                      std::cerr);
  }
  if (argc >= 2 && std::string_view(argv[1]) == "trace-merge") {
    return ddp::launcher::trace_merge_main(argc, argv);
  }
  ddp::launcher::ParseResult parsed;
  try {
    parsed = ddp::launcher::parse_ddprun_args(argc, argv);
  } catch (const ddp::Error& e) {
    // The error and a pointer to --help, not the whole usage after it: under a
    // terminal 110 lines of usage pushed the error off the screen (train does the same).
    std::cerr << "ddprun: " << e.what() << "\nddprun: run 'ddprun --help' for every option\n";
    return 2;
  }
  if (parsed.action == ddp::launcher::ParseAction::help) {
    std::cout << ddp::launcher::kDdprunUsage;
    return 0;
  }
  if (parsed.action == ddp::launcher::ParseAction::version) {
    std::cout << "ddprun (ddp) " << DDP_VERSION << "\n";
    return 0;
  }
  auto options = parsed.options;
  const char* path_env = std::getenv("PATH");
  using ddp::launcher::ProgramKind;
  const auto program = ddp::launcher::find_program(options.program, ddp::launcher::self_exe_dir(),
                                                   path_env != nullptr ? path_env : "",
                                                   options.module      ? ProgramKind::module
                                                   : options.no_python ? ProgramKind::no_python
                                                                       : ProgramKind::as_found,
                                                   ddp::env::get("PYTHON_EXEC").value_or(""));
  if (program.path.empty()) {
    std::cerr << "ddprun: error: " << program.error << "\n";
    return program.exit_code;
  }
  if (!program.interpreter_args.empty()) {  // python3 -u SCRIPT|-m MODULE ARGS (as torchrun)
    options.program_args.insert(options.program_args.begin(), program.interpreter_args.begin(),
                                program.interpreter_args.end());
    options.program = program.path;  // argv[0]: CPython finds its prefix (a venv) from it
  }
  // Note [a console that does not read]: the agent's own log lines (its store's)
  // go through the console queue too; what it queued is written before exit.
  ddp::set_log_writer([](std::string_view line) { ddp::launcher::console_write(2, line); });
  try {
    const int code = ddp::launcher::run_agent(options, program.path);
    ddp::launcher::console_flush();
    return code;
  } catch (const ddp::launcher::UsageError& e) {
    ddp::launcher::console_flush();
    std::cerr << "ddprun: error: " << e.what() << "\n";
    return 2;
  } catch (const ddp::launcher::ExecError& e) {
    ddp::launcher::console_flush();
    std::cerr << "ddprun: error: " << e.what() << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    ddp::launcher::console_flush();
    std::cerr << "ddprun: error: " << without_prefix(e.what()) << "\n";
    return 1;
  }
}
