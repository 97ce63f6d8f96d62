#include "runtime/data/csv.h"

#include "runtime/error.h"

#include "runtime/fmt.h"

#include <cerrno>
#include <clocale>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>

namespace ddp {
namespace {

constexpr std::string_view kUtf8Bom = "\xEF\xBB\xBF";

// One line split at commas outside double quotes; quotes removed, "" kept as ".
std::vector<std::string> split_fields(const std::string& line, const std::string& path,
                                      int64_t line_no) {
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        fields.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        fields.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  DDP_CHECK(!quoted, "{}:{}: a double quote is not closed", path, line_no);
  return fields;
}

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

// strtod in the C locale (a decimal point, whatever the user's locale says).
double parse_number(const std::string& text, bool& ok) {
  static const locale_t c_locale = newlocale(LC_NUMERIC_MASK, "C", nullptr);
  char* end = nullptr;
  errno = 0;
  const double v = strtod_l(text.c_str(), &end, c_locale);
  // Not strtod's hexadecimal forms (pandas reads 0x10 as text), nor a number past
  // the double range (1e400), which it would make infinite.
  ok = !text.empty() && end == text.c_str() + text.size() &&
       text.find_first_of("xX") == std::string::npos &&
       !(errno == ERANGE && std::fabs(v) == HUGE_VAL);
  return v;
}

}  // namespace

CsvTable parse_csv(const std::string& text, const std::string& path) {
  CsvTable table;
  std::istringstream in(text);
  std::string line;
  int64_t line_no = 0;
  bool have_header = false;
  while (std::getline(in, line)) {
    ++line_no;
    // Excel's "CSV UTF-8" starts with a byte-order mark; pandas drops it too.
    if (line_no == 1 && line.starts_with(kUtf8Bom)) line.erase(0, kUtf8Bom.size());
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trimmed(line).empty()) continue;
    auto fields = split_fields(line, path, line_no);
    if (!have_header) {
      size_t numbers = 0;
      for (auto& f : fields) {
        f = trimmed(f);
        bool numeric = false;
        parse_number(f, numeric);
        numbers += numeric ? 1 : 0;
        DDP_CHECK(!f.empty(),
                  "{}:{}: the header has an empty column name (column {}); the first line must "
                  "name every column{}",
                  path, line_no, table.columns.size() + 1,
                  table.columns.empty() ? " (pandas writes an unnamed index column first: "
                                          "save with df.to_csv(path, index=False))"
                                        : "");
        for (const auto& seen : table.columns) {
          DDP_CHECK(seen != f, "{}:{}: the column name '{}' appears twice", path, line_no, f);
        }
        table.columns.push_back(f);
      }
      // Names may be numbers (pandas names a bare array's columns 0, 1, ...), but a
      // first line of numbers only is data without a header.
      DDP_CHECK(numbers < fields.size(),
                "{}:{}: the first line holds only numbers ({}) where column names were "
                "expected: the file needs a header line naming its columns (if these are "
                "names, as pandas gives a bare array's columns, name at least one, e.g. the "
                "target: df.rename(columns={{9: 'label'}}))",
                path, line_no, line);
      have_header = true;
      continue;
    }
    DDP_CHECK(fields.size() == table.columns.size(),
              "{}:{}: {} field{} where the header names {} columns", path, line_no, fields.size(),
              fields.size() == 1 ? "" : "s", table.columns.size());
    for (size_t c = 0; c < fields.size(); ++c) {
      const std::string f = trimmed(fields[c]);
      DDP_CHECK(!f.empty(),
                "{}:{}: column '{}' is empty: expected a number (fill or drop missing values "
                "first, e.g. pandas' df.dropna())",
                path, line_no, table.columns[c]);
      bool ok = false;
      const double v = parse_number(f, ok);
      DDP_CHECK(ok,
                "{}:{}: column '{}' holds '{}': expected a number (encode categories as "
                "integers first)",
                path, line_no, table.columns[c], f);
      table.values.push_back(v);
    }
    table.lines.push_back(line_no);
    ++table.rows;
  }
  DDP_CHECK(have_header, "{}: empty: expected a header line naming the columns, then rows", path);
  DDP_CHECK(table.rows > 0, "{}: has a header ({}) but no rows of data", path,
            fmt::join(table.columns, ","));
  return table;
}

CsvTable read_csv(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  DDP_CHECK(fs::exists(path, ec), "{}: file not found (expected a CSV file)", path);
  DDP_CHECK(!fs::is_directory(path, ec), "{}: is a directory, expected a CSV file", path);
  std::ifstream in(path, std::ios::binary);
  DDP_CHECK(in.good(), "{}: cannot open: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return parse_csv(text.str(), path);
}

size_t CsvTable::index_of(const std::string& column, const std::string& path) const {
  for (size_t c = 0; c < columns.size(); ++c) {
    if (columns[c] == column) return c;
  }
  throw ValueError(fmt::format("{}: no column '{}'; its columns are {}", path, column,
                               fmt::join(columns, ", ")));
}

bool CsvTable::all_integers(const std::vector<std::string>& names, const std::string& path) const {
  for (const auto& name : names) {
    const size_t c = index_of(name, path);
    for (int64_t r = 0; r < rows; ++r) {
      const double v = values[static_cast<size_t>(r) * columns.size() + c];
      if (!std::isfinite(v) || v != std::floor(v) || std::fabs(v) > 9.0e15) return false;
    }
  }
  return true;
}

Tensor CsvTable::take(const std::vector<std::string>& names, DType dtype,
                      const std::string& path) const {
  DDP_CHECK(dtype == DType::f32 || dtype == DType::i64,
            "CsvTable::take: dtype {}: expected f32 "
            "or i64",
            dtype_name(dtype));
  std::vector<size_t> index;
  for (const auto& name : names) index.push_back(index_of(name, path));
  const auto k = static_cast<int64_t>(names.size());
  Tensor out = empty({rows, k}, {.dtype = dtype});
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const double v =
          values[static_cast<size_t>(r) * columns.size() + index[static_cast<size_t>(j)]];
      if (dtype == DType::f32) {
        DDP_CHECK(!std::isfinite(v) || std::fabs(v) <= std::numeric_limits<float>::max(),
                  "{}:{}: column '{}' holds {}, past float32's range (about 3.4e38): scale "
                  "the column first",
                  path, lines[static_cast<size_t>(r)], names[static_cast<size_t>(j)], v);
        out.data<float>()[r * k + j] = static_cast<float>(v);
      } else {
        DDP_CHECK(std::isfinite(v) && v == std::floor(v),
                  "{}:{}: column '{}' holds {}: expected an integer class id", path,
                  lines[static_cast<size_t>(r)], names[static_cast<size_t>(j)], v);
        out.data<int64_t>()[r * k + j] = static_cast<int64_t>(v);
      }
    }
  }
  return out;
}

}  // namespace ddp
