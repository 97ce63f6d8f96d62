#include "bench/table.h"

#include "runtime/checkpoint/json.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <ostream>

namespace ddp::bench {

Row& Row::set(std::string_view key, Cell cell) {
  for (auto& [k, v] : cells_) {
    if (k == key) {
      v = std::move(cell);
      return *this;
    }
  }
  cells_.emplace_back(std::string(key), std::move(cell));
  return *this;
}

Row& Row::add(std::string_view key, std::string value) {
  return set(key, std::move(value));
}
Row& Row::add(std::string_view key, int64_t value) {
  return set(key, value);
}
Row& Row::add(std::string_view key, double value, int precision) {
  return set(key, Number{value, precision});
}
Row& Row::add(std::string_view key, Number value) {
  return set(key, value);
}

const Cell* Row::find(std::string_view key) const {
  for (const auto& [k, v] : cells_) {
    if (k == key) return &v;
  }
  return nullptr;
}

namespace {

std::string table_text(const Cell& cell) {
  if (const auto* s = std::get_if<std::string>(&cell)) return *s;
  if (const auto* i = std::get_if<int64_t>(&cell)) return fmt::format("{}", *i);
  const auto& n = std::get<Number>(cell);
  if (!std::isfinite(n.value)) return fmt::format("{}", n.value);
  return n.scientific ? fmt::format("{:.{}e}", n.value, n.precision)
                      : fmt::format("{:.{}f}", n.value, n.precision);
}

std::string json_value(const Cell& cell) {
  if (const auto* s = std::get_if<std::string>(&cell)) return json::quote(*s);
  if (const auto* i = std::get_if<int64_t>(&cell)) return fmt::format("{}", *i);
  const auto& n = std::get<Number>(cell);
  if (!std::isfinite(n.value)) return "null";
  return fmt::format("{:.7g}", n.value);  // what float event times and our ratios hold
}

}  // namespace

void print_table(std::ostream& os, std::string_view title, const std::vector<Row>& rows) {
  std::vector<std::string> columns;
  for (const Row& row : rows) {
    for (const auto& [key, cell] : row.cells()) {
      if (std::find(columns.begin(), columns.end(), key) == columns.end()) columns.push_back(key);
    }
  }
  // text[r][c], with the widest entry of each column deciding its width.
  std::vector<std::vector<std::string>> text(rows.size());
  std::vector<bool> numeric(columns.size(), false);
  std::vector<size_t> width(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) width[c] = columns[c].size();
  for (size_t r = 0; r < rows.size(); ++r) {
    for (size_t c = 0; c < columns.size(); ++c) {
      const Cell* cell = rows[r].find(columns[c]);
      text[r].push_back(cell != nullptr ? table_text(*cell) : "-");
      if (cell != nullptr && !std::holds_alternative<std::string>(*cell)) numeric[c] = true;
      width[c] = std::max(width[c], text[r][c].size());
    }
  }
  auto print_line = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) line += "  ";
      line += numeric[c] ? fmt::format("{:>{}}", cells[c], width[c])
                         : fmt::format("{:<{}}", cells[c], width[c]);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << line << '\n';
  };
  if (!title.empty()) os << "== " << title << " ==\n";
  print_line(columns);
  for (const auto& row_text : text) print_line(row_text);
  os << '\n';
}

void print_json_line(std::ostream& os, const Row& row) {
  std::string line = "{";
  bool first = true;
  for (const auto& [key, cell] : row.cells()) {
    if (!first) line += ", ";
    first = false;
    line += json::quote(key) + ": " + json_value(cell);
  }
  line += "}\n";
  os << line;
}

Reporter::Reporter(std::string bench, bool json) : bench_(std::move(bench)), json_(json) {}

void Reporter::section(std::string_view name, const std::vector<Row>& rows) const {
  if (!json_) {
    print_table(std::cout, fmt::format("{}: {}", bench_, name), rows);
    std::cout.flush();
    return;
  }
  for (const Row& row : rows) {
    Row tagged;
    tagged.add("bench", bench_).add("section", std::string(name));
    for (const auto& [key, cell] : row.cells()) {
      std::visit([&](const auto& v) { tagged.add(key, v); }, cell);
    }
    print_json_line(std::cout, tagged);
  }
  std::cout.flush();
}

void Reporter::note(std::string_view text) const {
  if (!json_) {
    std::cerr << "note: " << text << '\n';
    return;
  }
  Row row;
  row.add("bench", bench_).add("note", std::string(text));
  print_json_line(std::cout, row);
  std::cout.flush();
}

void Reporter::progress(std::string_view text) const {
  std::cerr << "[" << bench_ << "] " << text << '\n';
}

}  // namespace ddp::bench
