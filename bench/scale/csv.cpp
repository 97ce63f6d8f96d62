#include "bench/scale/csv.h"

#include "runtime/error.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdlib>
#include <map>

namespace ddp::scaling {
namespace {

constexpr std::array kColumns = {
    "impl",           "model",           "scaling",    "backend", "bucket_cap_mb", "world_size",
    "batch_per_rank", "global_batch",    "steps",      "threads", "repeat",        "samples_per_s",
    "step_ms",        "comm_exposed_ms", "efficiency", "load1",   "timestamp"};
// Columns added later: a CSV without them reads as 0 (written by an older scale).
constexpr std::array kOptionalColumns = {"tokens_per_s", "setup"};

std::vector<std::string_view> split(std::string_view line) {
  std::vector<std::string_view> fields;
  size_t start = 0;
  while (true) {
    const size_t comma = line.find(',', start);
    fields.push_back(line.substr(start, comma - start));
    if (comma == std::string_view::npos) return fields;
    start = comma + 1;
  }
}

// One data line, fields looked up by the header's column names.
class Row {
 public:
  Row(const std::map<std::string, size_t, std::less<>>& index, std::vector<std::string_view> fields,
      size_t line)
      : index_(index), fields_(std::move(fields)), line_(line) {}

  bool has(std::string_view column) const { return index_.contains(column); }
  std::string_view text(std::string_view column) const {
    const size_t i = index_.find(column)->second;
    DDP_CHECK(i < fields_.size(), "scale CSV line {}: no value for column '{}' ({} fields)", line_,
              column, fields_.size());
    return fields_[i];
  }
  int integer(std::string_view column) const {
    const std::string_view t = text(column);
    int value = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), value);
    DDP_CHECK(ec == std::errc() && end == t.data() + t.size(),
              "scale CSV line {}: column '{}' = '{}' is not an integer", line_, column, t);
    return value;
  }
  double number(std::string_view column) const {
    const std::string t(text(column));
    char* end = nullptr;
    const double value = std::strtod(t.c_str(), &end);
    DDP_CHECK(!t.empty() && end == t.c_str() + t.size(),
              "scale CSV line {}: column '{}' = '{}' is not a number", line_, column, t);
    return value;
  }

 private:
  const std::map<std::string, size_t, std::less<>>& index_;
  std::vector<std::string_view> fields_;
  size_t line_;
};

// A gpt spec holds commas (gpt:layers=4,d=128,...): the CSV writes them as ';'
// (no quoting needed by any reader) and reads them back.
std::string model_to_csv(std::string model) {
  std::replace(model.begin(), model.end(), ',', ';');
  return model;
}
std::string model_from_csv(std::string_view text) {
  std::string model(text);
  std::replace(model.begin(), model.end(), ';', ',');
  return model;
}

Measurement parse_row(const Row& r) {
  Measurement m;
  m.spec = {.impl = std::string(r.text("impl")),
            .model = model_from_csv(r.text("model")),
            .scaling = std::string(r.text("scaling")),
            .backend = std::string(r.text("backend")),
            .bucket_cap_mb = r.number("bucket_cap_mb"),
            .world_size = r.integer("world_size"),
            .batch_per_rank = r.integer("batch_per_rank"),
            .steps = r.integer("steps"),
            .threads = r.integer("threads"),
            .repeat = r.integer("repeat")};
  m.samples_per_s = r.number("samples_per_s");
  m.step_ms = r.number("step_ms");
  m.comm_exposed_ms = r.number("comm_exposed_ms");
  m.efficiency = r.number("efficiency");
  m.load1 = r.number("load1");
  m.timestamp = std::string(r.text("timestamp"));
  m.tokens_per_s = r.has("tokens_per_s") ? r.number("tokens_per_s") : 0.0;
  m.spec.setup = r.has("setup") ? std::string(r.text("setup")) : "";
  return m;
}

}  // namespace

std::string csv_header() {
  return fmt::format("{},{}", fmt::join(kColumns, ","), fmt::join(kOptionalColumns, ","));
}

std::string csv_row(const Measurement& m) {
  const PointSpec& p = m.spec;
  return fmt::format(
      "{},{},{},{},{},{},{},{},{},{},{},{:.1f},{:.4f},{:.4f},{:.4f},{:.2f},{},{:.1f},{}", p.impl,
      model_to_csv(p.model), p.scaling, p.backend, p.bucket_cap_mb, p.world_size, p.batch_per_rank,
      p.global_batch(), p.steps, p.threads, p.repeat, m.samples_per_s, m.step_ms, m.comm_exposed_ms,
      m.efficiency, m.load1, m.timestamp, m.tokens_per_s, p.setup);
}

std::string csv_text(const std::vector<Measurement>& measurements) {
  std::string out = csv_header() + "\n";
  for (const auto& m : measurements) out += csv_row(m) + "\n";
  return out;
}

std::vector<Measurement> parse_csv(std::string_view text) {
  std::vector<Measurement> out;
  std::map<std::string, size_t, std::less<>> index;
  size_t line_number = 0;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (index.empty()) {
      const auto names = split(line);
      for (size_t i = 0; i < names.size(); ++i) index.emplace(std::string(names[i]), i);
      for (const char* column : kColumns) {
        DDP_CHECK(index.contains(column),
                  "scale CSV: the header (line {}) has no column '{}'; expected {}. Is this a "
                  "file written by `scale`?",
                  line_number, column, csv_header());
      }
      continue;
    }
    out.push_back(parse_row(Row(index, split(line), line_number)));
  }
  return out;
}

}  // namespace ddp::scaling
