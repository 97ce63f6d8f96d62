// One output stream (stdout or stderr) of one rank, as the agent sees it: the
// read end of a pipe. Bytes are buffered until a newline and written to the
// console as whole, prefixed lines, one write() each; the agent is the only
// writer and single-threaded, so no rank's line is ever cut by another's. The
// log file gets the bytes as they come, without prefix.
#pragma once

#include "launcher/process.h"

#include <chrono>
#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace ddp::launcher {

// Note [one error per job]: when every rank fails alike at start-up (a missing
// data file, no GPU, a bad flag that only the program checks), each prints the
// same error line, and W copies of it bury what else was said. The agent's
// streams share one ErrorEcho: a line that states an error (states_an_error:
// "error:", "what():", Python's "RuntimeError: ..."; not a log line that merely
// says "validation error 0.25" or "eval error: 0.25", nor a traceback's "Traceback (most recent
// call last):" header, whose stack below differs) that another rank of this node printed word for
// word within the last 10 s is shown as "[rank 3] the same error as rank 1" instead. The rank's log
// file and its tail (the failure summary's quote) keep the line itself; lines that differ (a device
// index, a path with the rank in it) are all shown.
class ErrorEcho {
 public:
  using Clock = std::chrono::steady_clock;
  // The rank that printed `line` first within the window, or -1 (and `line` is
  // remembered as `rank`'s).
  int earlier_rank(std::string_view line, int rank, Clock::time_point now);

 private:
  struct Seen {
    std::string line;
    int rank;
    Clock::time_point at;
  };
  std::deque<Seen> recent_;  // the last few error lines, oldest first
};

struct StreamSink {
  int console_fd = -1;    // 1 or 2, or -1: not shown on the console
  int file_fd = -1;       // the rank's log file, or -1
  std::string prefix;     // "[rank 3] ", or "" (--no-prefix)
  size_t tail_lines = 0;  // last lines kept for the failure summary
  int rank = -1;          // for ErrorEcho
  ErrorEcho* echo =
      nullptr;  // stderr: errors other ranks printed already (Note [one error per job])
};

// Lines longer than this are written in pieces of this size (a rank printing
// megabytes without a newline must not grow the agent without bound).
inline constexpr size_t kMaxLineBytes = 64 * 1024;

class RankStream {
 public:
  RankStream(Fd pipe_read, StreamSink sink);
  RankStream(const RankStream&) = delete;
  RankStream& operator=(const RankStream&) = delete;

  // The pipe to poll, -1 once closed.
  int fd() const { return pipe_.get(); }
  // Reads what is there without blocking; at end of file writes the last,
  // unterminated line (with a newline) and closes the pipe.
  void on_readable();
  // Drains what is left without waiting and closes (the rank is gone and its
  // pipe may be held open by an escaped grandchild).
  void close();
  const std::deque<std::string>& tail() const { return tail_; }
  // The last line that reads as an error ("error", "Error", "ERROR", "what():",
  // "Traceback", "Exception", "FAIL"), kept however many lines came after it (a
  // usage text printed after the error would push it out of the tail); "" if none.
  // Only kept when tail_lines > 0.
  const std::string& last_error_line() const { return last_error_; }

 private:
  void consume(std::string_view bytes);
  void emit_line(std::string_view line);
  void finish();

  Fd pipe_;
  StreamSink sink_;
  std::string partial_;
  std::string line_;  // reused for "prefix + line + \n"
  std::deque<std::string> tail_;
  std::string last_error_;
};

// Whether a line of a rank's stderr reads as an error (RankStream::last_error_line).
bool reads_as_error(std::string_view line);
// Whether it states one, for Note [one error per job]: stricter than reads_as_error.
bool states_an_error(std::string_view line);

}  // namespace ddp::launcher
