// Note [trace files]: the per-rank file, written and read back.
#include "runtime/trace_file.h"

#include "runtime/checkpoint/json.h"
#include "runtime/error.h"

#include <mutex>
#include <ostream>
#include <set>

namespace ddp::trace {
namespace {

constexpr int kVersion = 1;

// Argument keys read from a file live as long as the process (Arg keeps a pointer).
const char* intern(const std::string& key) {
  static std::mutex mutex;
  static auto* keys = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mutex);
  return keys->insert(key).first->c_str();
}

void write_event(std::ostream& out, const TraceEvent& e) {
  out << "{\"ph\": \"" << e.phase << "\", \"track\": " << e.track << ", \"ts\": " << e.ts;
  if (e.phase == 'X') out << ", \"dur\": " << e.duration_ns;
  if (e.phase == 's' || e.phase == 't' || e.phase == 'f') out << ", \"id\": " << e.id;
  out << ", \"name\": " << json::quote(e.name) << ", \"cat\": " << json::quote(e.category);
  if (e.unfinished) out << ", \"unfinished\": 1";
  if (!e.args.empty()) {
    out << ", \"args\": {";
    for (size_t i = 0; i < e.args.size(); ++i) {
      out << (i == 0 ? "" : ", ") << json::quote(e.args[i].key) << ": " << e.args[i].value;
    }
    out << "}";
  }
  out << "}";
}

// Reading: every field checked, so a damaged file is named, not half-merged.
class Reader {
 public:
  explicit Reader(const std::string& source) : source_(source) {}

  const json::Value& field(const json::Value& object, std::string_view key,
                           json::Value::Kind kind) const {
    const json::Value* v = object.find(key);
    DDP_CHECK(v != nullptr && v->kind == kind,
              "{}: not a ddp trace file: \"{}\" is {}, expected {} (Note [trace files])", source_,
              key, v == nullptr ? "missing" : json::kind_name(v->kind), json::kind_name(kind));
    return *v;
  }
  int64_t integer(const json::Value& o, std::string_view key) const {
    return field(o, key, json::Value::Kind::integer).integer;
  }
  std::string string(const json::Value& o, std::string_view key) const {
    return field(o, key, json::Value::Kind::string).string;
  }
  int64_t integer_or(const json::Value& o, std::string_view key, int64_t fallback) const {
    return o.find(key) == nullptr ? fallback : integer(o, key);
  }

  TraceEvent event(const json::Value& v) const {
    DDP_CHECK(v.kind == json::Value::Kind::object, "{}: an event is {}, expected an object",
              source_, json::kind_name(v.kind));
    TraceEvent e;
    const std::string ph = string(v, "ph");
    DDP_CHECK(ph == "X" || ph == "i" || ph == "s" || ph == "t" || ph == "f",
              "{}: event phase '{}' is not one of X, i, s, t, f", source_, ph);
    e.phase = ph[0];
    e.track = static_cast<Track>(integer(v, "track"));
    e.ts = integer(v, "ts");
    e.duration_ns = integer_or(v, "dur", 0);
    e.id = static_cast<uint64_t>(integer_or(v, "id", 0));
    e.name = string(v, "name");
    e.category = string(v, "cat");
    e.unfinished = integer_or(v, "unfinished", 0) != 0;
    if (const json::Value* args = v.find("args")) {
      DDP_CHECK(args->kind == json::Value::Kind::object, "{}: \"args\" is {}, expected an object",
                source_, json::kind_name(args->kind));
      for (const auto& [key, value] : args->object) {
        DDP_CHECK(value.kind == json::Value::Kind::integer,
                  "{}: argument \"{}\" is {}, expected an integer", source_, key,
                  json::kind_name(value.kind));
        e.args.push_back({intern(key), value.integer});
      }
    }
    return e;
  }

 private:
  const std::string& source_;
};

}  // namespace

std::string rank_file_name(int rank) {
  return fmt::format("rank_{}.json", rank);
}

void write_rank_file(std::ostream& out, const Snapshot& s) {
  out << "{\"format\": \"ddp-trace\", \"version\": " << kVersion << ", \"rank\": " << s.rank.rank
      << ", \"world_size\": " << s.rank.world_size << ", \"run_id\": " << json::quote(s.rank.run_id)
      << ", \"restart\": " << s.rank.restart << ", \"launcher\": " << json::quote(s.rank.launcher)
      << ", \"backend\": " << json::quote(s.rank.backend) << ", \"pid\": " << s.pid
      << ", \"host\": " << json::quote(s.host) << ", \"taken_ns\": " << s.taken_ns
      << ", \"dropped\": " << s.dropped << ",\n\"clock\": [";
  for (size_t i = 0; i < s.clock.size(); ++i) {
    const ClockSample& c = s.clock[i];
    out << (i == 0 ? "" : ", ") << "{\"local_ns\": " << c.local_ns
        << ", \"offset_ns\": " << c.offset_ns << ", \"error_ns\": " << c.error_ns
        << ", \"reference\": " << json::quote(c.reference) << "}";
  }
  out << "],\n\"tracks\": [";
  for (size_t i = 0; i < s.tracks.size(); ++i) {
    const TrackInfo& t = s.tracks[i];
    out << (i == 0 ? "" : ", ") << "{\"id\": " << t.id << ", \"name\": " << json::quote(t.name)
        << ", \"os_tid\": " << t.os_tid << "}";
  }
  out << "],\n\"events\": [";
  for (size_t i = 0; i < s.events.size(); ++i) {
    out << (i == 0 ? "\n" : ",\n");
    write_event(out, s.events[i]);
  }
  out << "\n]}\n";
}

Snapshot parse_rank_file(std::string_view text, const std::string& source) {
  json::Value doc;
  try {
    doc = json::parse(text);
  } catch (const ValueError& e) {
    throw ValueError(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  const Reader read(source);
  DDP_CHECK(doc.kind == json::Value::Kind::object && doc.find("format") != nullptr &&
                read.string(doc, "format") == "ddp-trace",
            "{}: not a ddp trace file (no \"format\": \"ddp-trace\"; Note [trace files])", source);
  const int64_t version = read.integer(doc, "version");
  DDP_CHECK(version == kVersion,
            "{}: trace file version {}, this ddp reads version {}; merge it with the ddprun of the "
            "ddp that wrote it",
            source, version, kVersion);
  Snapshot s;
  s.rank.rank = static_cast<int>(read.integer(doc, "rank"));
  s.rank.world_size = static_cast<int>(read.integer(doc, "world_size"));
  s.rank.run_id = read.string(doc, "run_id");
  s.rank.restart = static_cast<int>(read.integer(doc, "restart"));
  s.rank.launcher = read.string(doc, "launcher");
  s.rank.backend = read.string(doc, "backend");
  s.pid = read.integer(doc, "pid");
  s.host = read.string(doc, "host");
  s.taken_ns = read.integer(doc, "taken_ns");
  s.dropped = read.integer(doc, "dropped");
  for (const json::Value& c : read.field(doc, "clock", json::Value::Kind::array).array) {
    s.clock.push_back({.local_ns = read.integer(c, "local_ns"),
                       .offset_ns = read.integer(c, "offset_ns"),
                       .error_ns = read.integer(c, "error_ns"),
                       .reference = read.string(c, "reference")});
  }
  for (const json::Value& t : read.field(doc, "tracks", json::Value::Kind::array).array) {
    s.tracks.push_back({.id = static_cast<Track>(read.integer(t, "id")),
                        .name = read.string(t, "name"),
                        .os_tid = read.integer(t, "os_tid")});
  }
  for (const json::Value& e : read.field(doc, "events", json::Value::Kind::array).array) {
    s.events.push_back(read.event(e));
  }
  return s;
}

}  // namespace ddp::trace
