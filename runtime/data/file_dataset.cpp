#include "runtime/data/file_dataset.h"

#include "runtime/data/csv.h"
#include "runtime/data/npy.h"
#include "runtime/error.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

namespace ddp {
namespace fs = std::filesystem;
namespace {

bool is_integer_dtype(DType d) {
  return d == DType::i32 || d == DType::i64 || d == DType::u8;
}

// Rows of `t` (dim 0) in `rows`' order, copied.
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  Shape shape = t.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = empty(shape, {.dtype = t.dtype()});
  const size_t row_bytes = t.nbytes() / static_cast<size_t>(t.size(0));
  const auto* src = static_cast<const uint8_t*>(t.data_ptr());
  auto* dst = static_cast<uint8_t*>(out.data_ptr());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(dst + i * row_bytes, src + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
  }
  return out;
}

std::string extension(const std::string& path) {
  return fs::path(path).extension().string();
}

struct Arrays {
  Tensor x, y, x_test, y_test;
};

Arrays npz_arrays(const std::string& path) {
  auto arrays = read_npz(path);
  const auto names = [&] {
    std::vector<std::string> v;
    for (const auto& [k, _] : arrays) v.push_back(k);
    return fmt::format("{}", fmt::join(v, ", "));
  };
  for (const char* need : {"x", "y"}) {
    DDP_CHECK(arrays.count(need) != 0,
              "{}: no array '{}'; it holds {}. Save inputs as x and targets as y: "
              "np.savez(path, x=inputs, y=targets)",
              path, need, names());
  }
  Arrays a{arrays["x"], arrays["y"], {}, {}};
  if (arrays.count("x_test") != 0 || arrays.count("y_test") != 0) {
    DDP_CHECK(arrays.count("x_test") != 0 && arrays.count("y_test") != 0,
              "{}: has {} without {}: give both for a test set, or neither", path,
              arrays.count("x_test") != 0 ? "x_test" : "y_test",
              arrays.count("x_test") != 0 ? "y_test" : "x_test");
    a.x_test = arrays["x_test"];
    a.y_test = arrays["y_test"];
  }
  return a;
}

Arrays npy_dir_arrays(const std::string& dir) {
  const auto file = [&](const char* name) { return (fs::path(dir) / name).string(); };
  Arrays a;
  a.x = read_npy(file("x.npy"));
  DDP_CHECK(fs::exists(file("y.npy")),
            "{}: has x.npy but no y.npy: save the targets beside it, np.save('{}', targets)", dir,
            file("y.npy"));
  a.y = read_npy(file("y.npy"));
  const bool xt = fs::exists(file("x_test.npy")), yt = fs::exists(file("y_test.npy"));
  DDP_CHECK(xt == yt, "{}: has {} without {}: give both for a test set, or neither", dir,
            xt ? "x_test.npy" : "y_test.npy", xt ? "y_test.npy" : "x_test.npy");
  if (xt) {
    a.x_test = read_npy(file("x_test.npy"));
    a.y_test = read_npy(file("y_test.npy"));
  }
  return a;
}

// A CSV's inputs and targets by the options' columns; targets i64 when they are
// one column of whole numbers (and not kind regress), else f32.
std::pair<Tensor, Tensor> csv_arrays(const std::string& path, const FileDataOptions& o) {
  const CsvTable table = read_csv(path);
  std::vector<std::string> targets = o.target_columns;
  if (targets.empty()) targets.push_back(table.columns.back());
  for (const auto& t : targets) table.index_of(t, path);
  std::vector<std::string> inputs = o.input_columns;
  if (inputs.empty()) {
    for (const auto& c : table.columns) {
      if (std::find(targets.begin(), targets.end(), c) == targets.end()) inputs.push_back(c);
    }
  }
  DDP_CHECK(!inputs.empty(), "{}: no input columns: the targets ({}) are every column", path,
            fmt::join(targets, ", "));
  for (const auto& in : inputs) {
    DDP_CHECK(std::find(targets.begin(), targets.end(), in) == targets.end(),
              "{}: column '{}' is both an input and a target", path, in);
  }
  const bool ids =
      targets.size() == 1 && o.kind != TargetKind::regress && table.all_integers(targets, path);
  return {table.take(inputs, DType::f32, path),
          table.take(targets, ids ? DType::i64 : DType::f32, path)};
}

Arrays read_arrays(const std::string& path, const FileDataOptions& o) {
  const std::string ext = extension(path);
  if (ext == ".csv") {
    auto [x, y] = csv_arrays(path, o);
    return {x, y, {}, {}};
  }
  DDP_CHECK(o.input_columns.empty() && o.target_columns.empty(),
            "{}: input and target columns name CSV columns; this is not a .csv file (NumPy "
            "data: the arrays x and y)",
            path);
  if (ext == ".npz") return npz_arrays(path);
  if (fs::is_directory(path)) return npy_dir_arrays(path);
  if (ext == ".npy") {
    throw ValueError(fmt::format(
        "{}: one .npy holds one array, and training needs inputs and targets: save them as "
        "x.npy and y.npy in a directory and pass the directory, or as one .npz "
        "(np.savez(path, x=inputs, y=targets))",
        path));
  }
  throw ValueError(fmt::format(
      "{}: not a data file this reads: expected .npz, .csv, or a directory with x.npy and y.npy",
      path));
}

}  // namespace

TargetKind parse_target_kind(const std::string& text) {
  if (text == "auto") return TargetKind::auto_detect;
  if (text == "classify") return TargetKind::classify;
  if (text == "regress") return TargetKind::regress;
  throw ValueError(fmt::format("target kind '{}': expected auto, classify or regress", text));
}

bool is_file_data(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return fs::exists(fs::path(path) / "x.npy", ec);
  const std::string ext = extension(path);
  return ext == ".npz" || ext == ".csv" || ext == ".npy";
}

Dataset make_dataset(const Tensor& inputs, const Tensor& targets, const std::string& name,
                     TargetKind kind) {
  DDP_CHECK(inputs.defined() && targets.defined() && inputs.dim() >= 1 && targets.dim() >= 1,
            "{}: inputs and targets must be arrays of at least one dimension (rows first)", name);
  const int64_t n = inputs.size(0);
  DDP_CHECK(n > 0, "{}: no rows", name);
  DDP_CHECK(targets.size(0) == n,
            "{}: {} rows of inputs {} but {} of targets {}: they must have one target per row",
            name, n, shape_str(inputs.shape()), targets.size(0), shape_str(targets.shape()));
  DDP_CHECK(inputs.dim() <= 4,
            "{}: inputs {} have {} dimensions: expected [N, D] or [N, C, H, W] (reshape first)",
            name, shape_str(inputs.shape()), inputs.dim());
  Dataset d;
  d.name = name;
  Tensor x = inputs.cpu().to(DType::f32);
  if (x.dim() == 1) x = x.reshape({n, 1});
  if (x.dim() == 3) x = x.reshape({n, 1, x.size(1), x.size(2)});
  d.inputs = x.clone();

  const Tensor y = targets.cpu();
  const bool one_column = y.dim() == 1 || (y.dim() == 2 && y.size(1) == 1);
  bool classes = false;
  if (kind == TargetKind::classify) {
    DDP_CHECK(one_column, "{}: targets {}: classification needs one class id per row ([N])", name,
              shape_str(y.shape()));
    classes = true;
  } else if (kind == TargetKind::auto_detect && one_column && is_integer_dtype(y.dtype())) {
    const auto ids = y.to(DType::i64).to_vector<int64_t>();
    classes = *std::min_element(ids.begin(), ids.end()) >= 0;
  }
  if (classes) {
    const Tensor yf = y.to(DType::f32);
    const Tensor ids = y.to(DType::i64).reshape({n});
    const auto values = ids.to_vector<int64_t>();
    const auto floats = yf.to_vector<float>();
    int64_t top = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto v = values[static_cast<size_t>(i)];
      DDP_CHECK(static_cast<float>(v) == floats[static_cast<size_t>(i)] && v >= 0,
                "{}: target {} at row {} is not a class id (an integer >= 0)", name,
                floats[static_cast<size_t>(i)], i);
      top = std::max(top, v);
    }
    d.labels = ids.clone();
    d.num_classes = top + 1;
  } else {
    d.labels = y.to(DType::f32).reshape({n, y.numel() / n}).clone();
    d.num_classes = 0;
  }
  return d;
}

FileData load_file_data(const std::string& path, const FileDataOptions& o) {
  Arrays a = read_arrays(path, o);
  FileData out;
  if (!o.test_path.empty()) {
    DDP_CHECK(!a.x_test.defined(),
              "{}: holds a test set (x_test, y_test) and a test file {} was given too: keep one",
              path, o.test_path);
    const Arrays t = read_arrays(o.test_path, o);
    DDP_CHECK(!t.x_test.defined(), "{}: the test file holds a test set of its own (x_test)",
              o.test_path);
    a.x_test = t.x;
    a.y_test = t.y;
    out.test_source = o.test_path;
  } else if (a.x_test.defined()) {
    out.test_source = "x_test/y_test";
  } else {
    // Note [held-out rows].
    const int64_t n = a.x.size(0);
    DDP_CHECK(a.y.dim() >= 1 && a.y.size(0) == n,
              "{}: {} rows of inputs but {} of targets: they must have one target per row", path, n,
              a.y.dim() >= 1 ? a.y.size(0) : 0);
    DDP_CHECK(n >= 10,
              "{}: {} rows: holding every 10th row out as the test set needs at least 10; give "
              "a test set (x_test and y_test, or a test file)",
              path, n);
    std::vector<int64_t> train_rows, test_rows;
    for (int64_t i = 0; i < n; ++i) (i % 10 == 9 ? test_rows : train_rows).push_back(i);
    a.x_test = take_rows(a.x.cpu(), test_rows);
    a.y_test = take_rows(a.y.cpu(), test_rows);
    a.x = take_rows(a.x.cpu(), train_rows);
    a.y = take_rows(a.y.cpu(), train_rows);
    out.test_source = "every 10th row held out";
  }
  const std::string base = fs::path(path).filename().string();
  out.train = make_dataset(a.x, a.y, base + "/train", o.kind);
  out.test = make_dataset(a.x_test, a.y_test, base + "/test", o.kind);
  // The test set's classes are the training set's: a model has one output per class.
  const bool train_classes = out.train.num_classes > 0, test_classes = out.test.num_classes > 0;
  if (train_classes != test_classes) {
    // One split looked like class ids and the other not (negative or fractional
    // values): treat both as values.
    out.train = make_dataset(a.x, a.y, base + "/train", TargetKind::regress);
    out.test = make_dataset(a.x_test, a.y_test, base + "/test", TargetKind::regress);
  }
  const int64_t classes = std::max(out.train.num_classes, out.test.num_classes);
  out.train.num_classes = out.test.num_classes = classes;
  DDP_CHECK(out.train.inputs.shape().size() == out.test.inputs.shape().size() &&
                std::equal(out.train.inputs.shape().begin() + 1, out.train.inputs.shape().end(),
                           out.test.inputs.shape().begin() + 1),
            "{}: the training inputs are {} per row and the test inputs {}: they must match", path,
            shape_str(out.train.inputs.shape()), shape_str(out.test.inputs.shape()));
  DDP_CHECK(classes > 0 || out.train.labels.size(1) == out.test.labels.size(1),
            "{}: the training targets have {} columns and the test targets {}: they must match",
            path, out.train.labels.size(1), out.test.labels.size(1));
  return out;
}

}  // namespace ddp
