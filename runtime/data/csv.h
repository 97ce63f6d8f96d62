// Numeric tables from CSV files with a header line, as pandas.read_csv and
// np.loadtxt(skiprows=1, delimiter=',') read them.
//
// The first line names the columns (a name may be double-quoted, "a,b" with ""
// for a quote; names may be numbers, as pandas gives a bare array's columns, but
// not all of them: a first line of numbers only is data without a header); a
// UTF-8 byte-order mark before it is dropped. Each later line holds one number
// per column: what strtod reads in the C locale (1, -2.5, 1e-3, nan, inf; not its
// hexadecimal forms, nor numbers past the double range), surrounded by optional
// spaces and optionally double-quoted. Blank lines and a trailing newline are
// skipped; "\r\n" line ends are accepted. An empty field, text that is not a
// number, or a line with too few or too many fields throws ValueError naming the
// file, the line, the column and the text found.
#pragma once

#include "runtime/tensor.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ddp {

struct CsvTable {
  std::vector<std::string> columns;
  int64_t rows = 0;
  std::vector<double> values;  // rows x columns.size(), row-major
  std::vector<int64_t> lines;  // each row's line in the file (1: the header), for messages

  // The column's index; ValueError naming the columns there are when absent.
  size_t index_of(const std::string& column, const std::string& path) const;
  // A [rows, names.size()] tensor of the named columns, in that order, as f32
  // (or i64, where every value must then be an integer; the first that is not is
  // named).
  Tensor take(const std::vector<std::string>& names, DType dtype, const std::string& path) const;
  // Whether every value of the named columns is a whole number.
  bool all_integers(const std::vector<std::string>& names, const std::string& path) const;
};

CsvTable read_csv(const std::string& path);
// The same from text in memory; `path` only names it in messages.
CsvTable parse_csv(const std::string& text, const std::string& path);

}  // namespace ddp
