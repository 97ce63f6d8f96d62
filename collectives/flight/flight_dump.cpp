#include "collectives/flight/flight_dump.h"

#include "collectives/flight/flight_recorder.h"
#include "runtime/checkpoint/json.h"
#include "runtime/env.h"
#include "runtime/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

namespace ddp::flight {
namespace {

std::string record_json(const CollectiveRecord& r) {
  return fmt::format(
      "{{\"comm\": {}, \"sequence\": {}, \"op\": \"{}\", \"reduce_op\": \"{}\", \"root\": {}, "
      "\"dtype\": \"{}\", \"count\": {}, \"bytes\": {}, \"label\": {}, \"state\": \"{}\", "
      "\"timed_out\": {}, \"enqueued_ns\": {}, \"started_ns\": {}, \"finished_ns\": {}, "
      "\"wait_begin_ns\": {}, \"wait_ns\": {}}}",
      r.comm, r.sequence, collective_name(r.kind), reduce_op_name(r.op), r.root,
      dtype_name(r.dtype), r.count, r.bytes, json::quote(r.label), record_state_name(r.state),
      r.timed_out ? 1 : 0, r.enqueued_ns, r.started_ns, r.finished_ns, r.wait_begin_ns, r.wait_ns);
}

std::string status_json(const RankStatus& s) {
  return fmt::format(
      "{{\"last_progress_ns\": {}, \"first_ns\": {}, \"last_ns\": {}, \"waiters\": {}, "
      "\"wait_since_ns\": {}, \"wait_comm\": {}, \"wait_sequence\": {}, \"blocked_ns\": {}, "
      "\"steps\": {}, \"step_ns\": {}, \"step_blocked_ns\": {}, \"first_step_ns\": {}, "
      "\"first_step_blocked_ns\": {}, \"collective_timeout_ns\": {}, \"wait_torn\": {}}}",
      s.last_progress_ns, s.first_ns, s.last_ns, s.waiters, s.wait_since_ns, s.wait_comm,
      s.wait_sequence, s.blocked_ns, s.steps, s.step_ns, s.step_blocked_ns, s.first_step_ns,
      s.first_step_blocked_ns, s.collective_timeout_ns, s.wait_torn ? 1 : 0);
}

// Reads fields of one JSON object, naming the origin and the key in errors.
class Fields {
 public:
  Fields(const json::Value& v, std::string_view origin, std::string where)
      : v_(v), origin_(origin), where_(std::move(where)) {
    DDP_CHECK(v.kind == json::Value::Kind::object, "{}: {} is {}, expected an object", origin_,
              where_, json::kind_name(v.kind));
  }
  const json::Value& get(std::string_view key, json::Value::Kind kind) const {
    const json::Value* f = v_.find(key);
    DDP_CHECK(f != nullptr, "{}: {} has no \"{}\" (not a flight recorder dump of version {}?)",
              origin_, where_, key, kDumpVersion);
    DDP_CHECK(f->kind == kind, "{}: \"{}\" of {} is {}, expected {}", origin_, key, where_,
              json::kind_name(f->kind), json::kind_name(kind));
    return *f;
  }
  int64_t integer(std::string_view key) const {
    return get(key, json::Value::Kind::integer).integer;
  }
  int64_t integer_or(std::string_view key, int64_t fallback) const {
    return v_.find(key) == nullptr ? fallback : integer(key);
  }
  const std::string& string(std::string_view key) const {
    return get(key, json::Value::Kind::string).string;
  }
  template <typename E, size_t N>
  E name(std::string_view key, const E (&values)[N], std::string_view (*name_of)(E)) const {
    const std::string& text = string(key);
    for (E e : values) {
      if (name_of(e) == text) return e;
    }
    throw ValueError(
        fmt::format("{}: \"{}\" of {} is '{}', not a known name", origin_, key, where_, text));
  }

 private:
  const json::Value& v_;
  std::string_view origin_;
  std::string where_;
};

constexpr CollectiveKind kKinds[] = {CollectiveKind::all_reduce, CollectiveKind::broadcast,
                                     CollectiveKind::all_gather, CollectiveKind::reduce_scatter,
                                     CollectiveKind::reduce,     CollectiveKind::barrier};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
constexpr RecordState kStates[] = {RecordState::enqueued, RecordState::started,
                                   RecordState::completed, RecordState::failed};
constexpr ProcessState kProcessStates[] = {ProcessState::unknown, ProcessState::running,
                                           ProcessState::stopped, ProcessState::exited};

CollectiveRecord parse_record(const json::Value& v, std::string_view origin, size_t i) {
  const Fields f(v, origin, fmt::format("collective {}", i));
  CollectiveRecord r;
  r.comm = static_cast<int>(f.integer("comm"));
  r.sequence = f.integer("sequence");
  r.kind = f.name("op", kKinds, collective_name);
  r.op = f.name("reduce_op", kOps, reduce_op_name);
  r.root = static_cast<int>(f.integer("root"));
  r.dtype = f.name("dtype", kAllDTypes, dtype_name);
  r.count = f.integer("count");
  r.bytes = f.integer("bytes");
  r.label = f.string("label");
  r.state = f.name("state", kStates, record_state_name);
  r.timed_out = f.integer("timed_out") != 0;
  r.enqueued_ns = f.integer("enqueued_ns");
  r.started_ns = f.integer("started_ns");
  r.finished_ns = f.integer("finished_ns");
  r.wait_begin_ns = f.integer("wait_begin_ns");
  r.wait_ns = f.integer("wait_ns");
  return r;
}

RankStatus parse_status(const json::Value& v, std::string_view origin) {
  const Fields f(v, origin, "\"status\"");
  RankStatus s;
  s.last_progress_ns = f.integer("last_progress_ns");
  s.first_ns = f.integer("first_ns");
  s.last_ns = f.integer("last_ns");
  s.waiters = f.integer("waiters");
  s.wait_since_ns = f.integer("wait_since_ns");
  s.wait_comm = f.integer("wait_comm");
  s.wait_sequence = f.integer("wait_sequence");
  s.blocked_ns = f.integer("blocked_ns");
  s.steps = f.integer("steps");
  s.step_ns = f.integer("step_ns");
  s.step_blocked_ns = f.integer("step_blocked_ns");
  s.first_step_ns = f.integer_or("first_step_ns", 0);  // dumps before it: not known
  s.first_step_blocked_ns = f.integer_or("first_step_blocked_ns", 0);
  s.collective_timeout_ns = f.integer_or("collective_timeout_ns", 0);
  s.wait_torn = f.integer_or("wait_torn", 0) != 0;
  return s;
}

}  // namespace

std::string to_json(const RankSnapshot& s) {
  std::string out = fmt::format(
      "{{\"format\": {}, \"version\": {},\n \"rank\": {}, \"world_size\": {}, \"pid\": {}, "
      "\"host\": {}, \"backend\": {}, \"job\": {},\n \"reason\": {}, \"process\": \"{}\", "
      "\"process_detail\": {}, \"taken_ns\": {},\n \"capacity\": {}, \"recorded\": {}, "
      "\"torn\": {},\n \"status\": {},\n \"collectives\": [",
      json::quote(kDumpFormat), kDumpVersion, s.rank, s.world_size, s.pid, json::quote(s.host),
      json::quote(s.backend), json::quote(s.job), json::quote(s.reason),
      process_state_name(s.process), json::quote(s.process_detail), s.taken_ns, s.capacity,
      s.recorded, s.torn, status_json(s.status));
  for (size_t i = 0; i < s.records.size(); ++i) {
    out += i == 0 ? "\n  " : ",\n  ";
    out += record_json(s.records[i]);
  }
  out += "\n ]}\n";
  return out;
}

// The bound ddprun puts on a job's world size (kMaxWorldSize in launcher/options.cpp).
constexpr int64_t kMaxDumpWorldSize = int64_t{1} << 22;

RankSnapshot from_json(std::string_view text, std::string_view origin) {
  json::Value doc;
  try {
    doc = json::parse(text);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: not valid JSON: {}", origin, e.what()));
  }
  const Fields f(doc, origin, "the document");
  DDP_CHECK(f.string("format") == kDumpFormat && f.integer("version") == kDumpVersion,
            "{}: format '{}' version {}; expected '{}' version {}", origin, f.string("format"),
            f.integer("version"), kDumpFormat, kDumpVersion);
  // Checked before anything sizes a list by them (ddprun analyze lists every
  // expected rank: a world of 2e9 was a std::bad_alloc) or narrows them to int.
  const int64_t rank = f.integer("rank");
  const int64_t world_size = f.integer("world_size");
  DDP_CHECK(world_size >= 1 && world_size <= kMaxDumpWorldSize,
            "{}: \"world_size\" is {}; expected 1 to {} ranks (the most ddprun launches); "
            "the file is damaged or not a flight recorder dump: remove it from the directory",
            origin, world_size, kMaxDumpWorldSize);
  DDP_CHECK(rank >= 0 && rank < world_size, "{}: rank {} of world size {} is not a rank", origin,
            rank, world_size);
  RankSnapshot s;
  s.rank = static_cast<int>(rank);
  s.world_size = static_cast<int>(world_size);
  s.pid = f.integer("pid");
  s.host = f.string("host");
  s.backend = f.string("backend");
  s.job = f.string("job");
  s.reason = f.string("reason");
  s.process = f.name("process", kProcessStates, process_state_name);
  s.process_detail = f.string("process_detail");
  s.taken_ns = f.integer("taken_ns");
  s.capacity = f.integer("capacity");
  s.recorded = f.integer("recorded");
  s.torn = f.integer_or("torn", 0);
  s.status = parse_status(f.get("status", json::Value::Kind::object), origin);
  const auto& list = f.get("collectives", json::Value::Kind::array).array;
  s.records.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) s.records.push_back(parse_record(list[i], origin, i));
  return s;
}

std::string private_dump_base() {
  const auto tmp = env::get("TMPDIR");
  return fmt::format("{}/ddp_flight-{}", tmp && !tmp->empty() ? *tmp : std::string("/tmp"),
                     ::geteuid());
}

void make_dump_dir(const std::string& dir) {
  const std::string base = private_dump_base();
  if (dir == base || dir.starts_with(base + "/")) {  // Note [dump directories]
    if (::mkdir(base.c_str(), 0700) != 0 && errno != EEXIST) {
      throw Error(
          fmt::format("cannot make the flight recorder dump directory {}: {}; set {} to "
                      "a directory of yours",
                      base, std::strerror(errno), env::kFlightDir));
    }
    struct stat st {};
    const bool ok = ::lstat(base.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
                    st.st_uid == ::geteuid() && (st.st_mode & 022) == 0;
    DDP_CHECK_T(Error, ok,
                "{} is not a private directory of yours (uid {}): {}; flight recorder dumps do "
                "not go there. Remove it, or set {} to a directory of yours",
                base, ::geteuid(),
                S_ISLNK(st.st_mode)    ? "a symbolic link"
                : !S_ISDIR(st.st_mode) ? "not a directory"
                : st.st_uid != ::geteuid()
                    ? fmt::format("owned by uid {}", st.st_uid)
                    : fmt::format("others may write to it (mode {:o})", st.st_mode & 0777),
                env::kFlightDir);
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DDP_CHECK_T(Error, !ec,
              "cannot make the flight recorder dump directory {}: {}; set {} to a writable "
              "directory",
              dir, ec.message(), env::kFlightDir);
}

std::string write_dump(const std::string& dir, const RankSnapshot& snapshot) {
  make_dump_dir(dir);
  const std::string path = fmt::format("{}/{}", dir, dump_file_name(snapshot.rank));
  // A temporary of its own (O_EXCL, a random name): two dumps of one process at
  // once (SIGUSR1 and a timeout) never share it, and nothing planted there is
  // followed.
  std::string temp = fmt::format("{}/.{}.XXXXXX", dir, dump_file_name(snapshot.rank));
  const std::string text = to_json(snapshot);
  const int fd = ::mkostemp(temp.data(), O_CLOEXEC);
  DDP_CHECK_T(Error, fd >= 0,
              "cannot write the flight recorder dump {}: {}; set {} to a "
              "writable directory",
              temp, std::strerror(errno), env::kFlightDir);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  const int saved = errno;
  ::close(fd);
  if (done != text.size() || ::rename(temp.c_str(), path.c_str()) != 0) {
    const int why = done != text.size() ? saved : errno;
    ::unlink(temp.c_str());
    throw Error(
        fmt::format("cannot write the flight recorder dump {}: {}; set {} to a directory with room",
                    path, std::strerror(why), env::kFlightDir));
  }
  return path;
}

std::vector<RankSnapshot> read_dumps(const std::string& dir) {
  std::error_code ec;
  DDP_CHECK(std::filesystem::is_directory(dir, ec),
            "{}: not a directory; pass the directory holding flight_rank_<R>.json (DDP_FLIGHT_DIR, "
            "or the one ddprun named)",
            dir);
  std::map<int, RankSnapshot> by_rank;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with("flight_rank_") || !name.ends_with(".json")) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    DDP_CHECK(in.good(), "{}: cannot read it", entry.path().string());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    RankSnapshot s = from_json(text, entry.path().string());
    DDP_CHECK(by_rank.count(s.rank) == 0, "{}: a second dump of rank {}", entry.path().string(),
              s.rank);
    by_rank.emplace(s.rank, std::move(s));
  }
  DDP_CHECK(!by_rank.empty(), "{}: holds no flight_rank_<R>.json", dir);
  std::vector<RankSnapshot> out;
  for (auto& [rank, s] : by_rank) out.push_back(std::move(s));
  return out;
}

}  // namespace ddp::flight
