// Benchmark results: rows of ordered key -> value cells, printed either as an
// aligned table for people or as JSON lines for scripts.
//
// A Reporter owns the output format. In table mode each section is printed as
// a title, a header and aligned rows on stdout, and notes go to stderr. In JSON
// mode every row is one JSON object on its own stdout line, starting with the
// "bench" and "section" keys; notes are rows with a "note" key. Nothing else
// is written to stdout in JSON mode.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace ddp::bench {

// A floating-point cell: `precision` digits after the point in tables (in
// scientific notation when `scientific`, for errors such as 3.1e-07); JSON gets
// 7 significant digits (non-finite values become null).
struct Number {
  double value = 0.0;
  int precision = 2;
  bool scientific = false;
};

using Cell = std::variant<std::string, int64_t, Number>;

class Row {
 public:
  // Appends a cell; a repeated key replaces the earlier value in place.
  Row& add(std::string_view key, std::string value);
  Row& add(std::string_view key, const char* value) { return add(key, std::string(value)); }
  Row& add(std::string_view key, int64_t value);
  Row& add(std::string_view key, int value) { return add(key, static_cast<int64_t>(value)); }
  Row& add(std::string_view key, double value, int precision = 2);
  Row& add(std::string_view key, Number value);

  const std::vector<std::pair<std::string, Cell>>& cells() const { return cells_; }
  const Cell* find(std::string_view key) const;  // nullptr when absent

 private:
  Row& set(std::string_view key, Cell cell);
  std::vector<std::pair<std::string, Cell>> cells_;
};

// The columns are the union of the rows' keys in first-seen order; a row without
// a key shows "-" there. Strings are left-aligned, numbers right-aligned.
void print_table(std::ostream& os, std::string_view title, const std::vector<Row>& rows);
// One compact JSON object per row, one per line.
void print_json_line(std::ostream& os, const Row& row);

class Reporter {
 public:
  Reporter(std::string bench, bool json);

  bool json() const { return json_; }
  // A titled table (table mode) or one JSON line per row tagged with the section.
  void section(std::string_view name, const std::vector<Row>& rows) const;
  // A line such as "no CUDA device: ...": stderr in table mode, a JSON row otherwise.
  void note(std::string_view text) const;
  // Progress of long steps, always on stderr (never in the JSON stream).
  void progress(std::string_view text) const;

 private:
  std::string bench_;
  bool json_;
};

}  // namespace ddp::bench
