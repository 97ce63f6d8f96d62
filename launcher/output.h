// One output stream (stdout or stderr) of one rank, as the agent sees it: the
// read end of a pipe. Bytes are buffered until a newline and written to the
// console as whole, prefixed lines, one write() each; the agent is the only
// writer and single-threaded, so no rank's line is ever cut by another's. The
// log file gets the bytes as they come, without prefix.
#pragma once

#include "launcher/process.h"

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace ddp::launcher {

struct StreamSink {
  int console_fd = -1;    // 1 or 2, or -1: not shown on the console
  int file_fd = -1;       // the rank's log file, or -1
  std::string prefix;     // "[rank 3] ", or "" (--no-prefix)
  size_t tail_lines = 0;  // last lines kept for the failure summary
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

}  // namespace ddp::launcher
