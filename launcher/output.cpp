#include "launcher/output.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>

namespace ddp::launcher {

RankStream::RankStream(Fd pipe_read, StreamSink sink)
    : pipe_(std::move(pipe_read)), sink_(std::move(sink)) {}

void RankStream::on_readable() {
  char buffer[16384];
  // A bounded number of reads per wakeup, so one chatty rank cannot starve the others.
  for (int reads = 0; pipe_ && reads < 8; ++reads) {
    const ssize_t n = ::read(pipe_.get(), buffer, sizeof(buffer));
    if (n > 0) {
      if (sink_.file_fd >= 0) write_all(sink_.file_fd, buffer, static_cast<size_t>(n));
      consume(std::string_view(buffer, static_cast<size_t>(n)));
    } else if (n == 0) {
      finish();
    } else if (errno != EINTR) {
      if (errno != EAGAIN && errno != EWOULDBLOCK) finish();
      return;
    }
  }
}

void RankStream::close() {
  if (!pipe_) return;
  on_readable();
  finish();
}

void RankStream::consume(std::string_view bytes) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    if (newline == std::string_view::npos) {
      partial_.append(bytes);
      while (partial_.size() >= kMaxLineBytes) {
        emit_line(std::string_view(partial_).substr(0, kMaxLineBytes));
        partial_.erase(0, kMaxLineBytes);
      }
      return;
    }
    if (partial_.empty()) {
      emit_line(bytes.substr(0, newline));
    } else {
      partial_.append(bytes.substr(0, newline));
      emit_line(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(newline + 1);
  }
}

int ErrorEcho::earlier_rank(std::string_view line, int rank, Clock::time_point now) {
  constexpr auto kWindow = std::chrono::seconds(10);
  while (!recent_.empty() && now - recent_.front().at > kWindow) recent_.pop_front();
  for (const Seen& s : recent_) {
    if (s.rank != rank && s.line == line) return s.rank;
  }
  recent_.push_back({std::string(line), rank, now});
  if (recent_.size() > 16) recent_.pop_front();
  return -1;
}

void RankStream::emit_line(std::string_view line) {
  if (sink_.console_fd >= 0) {
    line_.assign(sink_.prefix);
    const int earlier = sink_.echo != nullptr && states_an_error(line)
                            ? sink_.echo->earlier_rank(line, sink_.rank, ErrorEcho::Clock::now())
                            : -1;
    if (earlier >= 0) {
      line_.append("the same error as rank " +
                   std::to_string(earlier));  // Note [one error per job]
    } else {
      line_.append(line);
    }
    line_.push_back('\n');
    console_write(sink_.console_fd, line_);  // Note [a console that does not read]
  }
  if (sink_.tail_lines > 0) {
    tail_.emplace_back(line);
    if (tail_.size() > sink_.tail_lines) tail_.pop_front();
    if (reads_as_error(line)) last_error_.assign(line.substr(0, 1000));
  }
}

bool reads_as_error(std::string_view line) {
  for (std::string_view word :
       {"error", "Error", "ERROR", "what():", "Traceback", "Exception", "FAIL"}) {
    if (line.find(word) != std::string_view::npos) return true;
  }
  return false;
}

bool states_an_error(std::string_view line) {
  for (std::string_view word : {"error:", "Error:", "ERROR:", "what():", "[error]"}) {
    for (size_t at = line.find(word); at != std::string_view::npos; at = line.find(word, at + 1)) {
      // "eval error: 0.25", "top-1 Error: 12%": a metric's value after a word, not an
      // error ("train: error: 2 ranks failed" is one).
      const size_t value = line.find_first_not_of(' ', at + word.size());
      const bool metric =
          word.ends_with(':') && at >= 2 && line[at - 1] == ' ' &&
          std::isalnum(static_cast<unsigned char>(line[at - 2])) != 0 &&
          value != std::string_view::npos &&
          std::string_view("0123456789-+.").find(line[value]) != std::string_view::npos;
      if (!metric) return true;
    }
  }
  // Python's exception line: "ValueError" or "torch.distributed.DistBackendError" alone.
  size_t end = 0;
  while (end < line.size() && (std::isalnum(static_cast<unsigned char>(line[end])) != 0 ||
                               line[end] == '_' || line[end] == '.')) {
    ++end;
  }
  const std::string_view head = line.substr(0, end);
  return end == line.size() && (head.ends_with("Error") || head.ends_with("Exception"));
}

void RankStream::finish() {
  if (!partial_.empty()) {
    emit_line(partial_);
    partial_.clear();
  }
  pipe_.reset();
}

}  // namespace ddp::launcher
