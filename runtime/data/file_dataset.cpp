#include "runtime/data/file_dataset.h"

#include "runtime/data/csv.h"
#include "runtime/data/npy.h"
#include "runtime/error.h"

#include "runtime/fmt.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace ddp {
namespace fs = std::filesystem;
namespace {

bool is_integer_dtype(DType d) {
  return d == DType::i32 || d == DType::i64 || d == DType::u8;
}

// Note [how many classes]: a model has an output per class id 0..C-1, so one
// stray large id (a sentinel, an id column that is not one) would make millions
// of outputs; ids past this bound are refused, naming the row.
constexpr int64_t kMaxClasses = int64_t{1} << 20;

// How messages name row i of a split: as its file knows it, a CSV's line
// ("line 7") or an array's index ("y[25]"), through the held-out split.
struct RowNames {
  std::string prefix = "row ", suffix;
  std::vector<int64_t> origin;  // row i's line or index; empty: i itself

  std::string operator()(int64_t i) const {
    return fmt::format("{}{}{}", prefix, origin.empty() ? i : origin[static_cast<size_t>(i)],
                       suffix);
  }
  // The same rows in the inputs' array: y[3] is x[3] there (a CSV's line is both's).
  RowNames of_inputs() const {
    RowNames out = *this;
    if (out.prefix.starts_with("y")) out.prefix[0] = 'x';
    return out;
  }
  RowNames take(const std::vector<int64_t>& rows) const {
    RowNames out{prefix, suffix, {}};
    for (int64_t r : rows)
      out.origin.push_back(origin.empty() ? r : origin[static_cast<size_t>(r)]);
    return out;
  }
};

RowNames array_rows(const std::string& array) {
  return {array + "[", "]", {}};
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

// The extension in lower case: DATA.CSV is a CSV.
std::string extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext;
}

struct Arrays {
  Tensor x, y, x_test, y_test;
  RowNames rows = array_rows("y"), test_rows = array_rows("y_test");
  // A CSV's columns as chosen (empty otherwise): a test CSV is read by these names.
  std::vector<std::string> inputs, targets;
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
  // An array named like a split of x or y but not one this reads (x_tset, X_test,
  // y_val, X) would be left out silently, and the test set held out of x instead:
  // named. Others (a class list, x_mean) are the file's own business.
  for (const auto& [k, _] : arrays) {
    const bool known = k == "x" || k == "y" || k == "x_test" || k == "y_test";
    std::string lower = k;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    bool looks = lower == "x" || lower == "y";
    if (!looks && lower.size() > 1 && (lower[0] == 'x' || lower[0] == 'y')) {
      const std::string rest = lower.substr(lower[1] == '_' ? 2 : 1);
      for (const char* split : {"test", "tset", "tst", "tes", "val", "valid", "validation", "train",
                                "trn", "eval", "dev"}) {
        looks = looks || rest == split;
      }
    }
    DDP_CHECK(known || !looks,
              "{}: array '{}' is none of the arrays this reads (x, y, x_test, y_test; it holds "
              "{}): rename it (a test set is x_test and y_test), or drop it",
              path, k, names());
  }
  Arrays a;
  a.x = arrays["x"];
  a.y = arrays["y"];
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

// The .npy files in `dir`, by name.
std::vector<std::string> npy_files(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (extension(e.path().string()) == ".npy") names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

Arrays npy_dir_arrays(const std::string& dir) {
  const auto file = [&](const char* name) { return (fs::path(dir) / name).string(); };
  DDP_CHECK(fs::exists(file("x.npy")),
            "{}: has no x.npy (it holds {}): save the inputs as x.npy and the targets as y.npy "
            "(names in lower case)",
            dir, fmt::join(npy_files(dir), ", "));
  Arrays a;
  a.rows = array_rows("y.npy");
  a.test_rows = array_rows("y_test.npy");
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

void check_distinct(const std::vector<std::string>& names, const char* flag,
                    const std::string& path) {
  for (size_t i = 0; i < names.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      DDP_CHECK(names[i] != names[j], "{}: {} names column '{}' twice", path, flag, names[i]);
    }
  }
}

// A CSV's inputs and targets by the options' columns; targets i64 when they are
// one column of whole numbers (and not kind regress), else f32. `train` is the
// training CSV when this is its test file: the columns are then the training
// file's, by name.
Arrays csv_arrays(const std::string& path, const FileDataOptions& o, const Arrays* train) {
  const CsvTable table = read_csv(path);
  std::vector<std::string> targets = train != nullptr ? train->targets : o.target_columns;
  std::vector<std::string> inputs = train != nullptr ? train->inputs : o.input_columns;
  if (train != nullptr) {
    for (const auto* names : {&inputs, &targets}) {
      for (const auto& c : *names) {
        DDP_CHECK(std::find(table.columns.begin(), table.columns.end(), c) != table.columns.end(),
                  "{}: no column '{}', which the training file has as {}; its columns are {}. A "
                  "test CSV needs the training file's columns, by name, in any order",
                  path, c, names == &inputs ? "an input" : "a target",
                  fmt::join(table.columns, ", "));
      }
    }
  }
  check_distinct(targets, "--target-columns", path);
  check_distinct(inputs, "--input-columns", path);
  if (targets.empty()) targets.push_back(table.columns.back());
  for (const auto& t : targets) table.index_of(t, path);
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
  Arrays a;
  a.x = table.take(inputs, DType::f32, path);
  a.y = table.take(targets, ids ? DType::i64 : DType::f32, path);
  a.rows = RowNames{"line ", "", table.lines};
  a.inputs = std::move(inputs);
  a.targets = std::move(targets);
  return a;
}

Arrays read_arrays(const std::string& path, const FileDataOptions& o,
                   const Arrays* train = nullptr) {
  const std::string ext = extension(path);
  if (ext == ".csv")
    return csv_arrays(path, o, train != nullptr && !train->inputs.empty() ? train : nullptr);
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

// Whether targets `y` are class ids under `kind` (Note [classification or
// regression]); auto: one integer column of values >= 0.
bool targets_are_classes(const Tensor& y, TargetKind kind) {
  if (kind != TargetKind::auto_detect) return kind == TargetKind::classify;
  const bool one_column = y.dim() == 1 || (y.dim() == 2 && y.size(1) == 1);
  if (!one_column || !is_integer_dtype(y.dtype()) || y.numel() == 0) return false;
  const auto ids = y.cpu().to(DType::i64).to_vector<int64_t>();
  return *std::min_element(ids.begin(), ids.end()) >= 0;
}

// NaN or inf in a row trained to a non-finite loss blamed on the learning rate, or
// (in the test set) scored an argmax of NaN logits with exit 0: the first one is
// named. `t`: a fresh f32 tensor, rows first.
void check_finite(const Tensor& t, const std::string& name, const char* what,
                  const RowNames& rows) {
  const float* p = t.data<float>();
  const int64_t per = t.numel() / t.size(0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (std::isfinite(p[i])) continue;
    throw ValueError(fmt::format(
        "{}: {} {} at {}{}: not a finite number; drop or impute missing values (NaN), or clip "
        "infinities, first",
        name, what, p[i], rows(i / per),
        per > 1 ? fmt::format(", element {}", i % per) : std::string()));
  }
}

// A Dataset of targets that are class ids (checked, each row named by `rows`,
// `hint` ending the message of a row that is not one) or values.
Dataset build_dataset(const Tensor& inputs, const Tensor& targets, const std::string& name,
                      bool classes, const RowNames& rows, const std::string& hint) {
  DDP_CHECK(inputs.defined() && targets.defined() && inputs.dim() >= 1 && targets.dim() >= 1,
            "{}: inputs and targets must be arrays of at least one dimension (rows first); "
            "these are {} and {}",
            name, inputs.defined() ? shape_str(inputs.shape()) : "undefined",
            targets.defined() ? shape_str(targets.shape()) : "undefined");
  const int64_t n = inputs.size(0);
  DDP_CHECK(n > 0, "{}: no rows", name);
  DDP_CHECK(targets.size(0) == n,
            "{}: {} rows of inputs {} but {} of targets {}: they must have one target per row",
            name, n, shape_str(inputs.shape()), targets.size(0), shape_str(targets.shape()));
  DDP_CHECK(inputs.dim() <= 4,
            "{}: inputs {} have {} dimensions: expected [N, D] or [N, C, H, W] (reshape first)",
            name, shape_str(inputs.shape()), inputs.dim());
  DDP_CHECK(inputs.numel() > 0 && targets.numel() > 0,
            "{}: inputs {} and targets {}: a row needs at least one input and one target", name,
            shape_str(inputs.shape()), shape_str(targets.shape()));
  Dataset d;
  d.name = name;
  Tensor x = inputs.cpu().to(DType::f32);
  if (x.dim() == 1) x = x.reshape({n, 1});
  if (x.dim() == 3) x = x.reshape({n, 1, x.size(1), x.size(2)});
  d.inputs = x.clone();
  check_finite(d.inputs, name, "input", rows.of_inputs());

  const Tensor y = targets.cpu();
  if (classes) {
    const bool one_column = y.dim() == 1 || (y.dim() == 2 && y.size(1) == 1);
    DDP_CHECK(one_column, "{}: targets {}: classification needs one class id per row ([N])", name,
              shape_str(y.shape()));
    const Tensor ids = y.to(DType::i64).reshape({n});
    const auto values = ids.to_vector<int64_t>();
    const auto floats = y.to(DType::f32).to_vector<float>();
    int64_t top = 0;
    for (int64_t i = 0; i < n; ++i) {
      const auto v = values[static_cast<size_t>(i)];
      const float f = floats[static_cast<size_t>(i)];
      DDP_CHECK(static_cast<float>(v) == f && v >= 0,
                "{}: target {} at {} is not a class id (an integer >= 0){}", name, f, rows(i),
                hint);
      // Note [how many classes].
      DDP_CHECK(v < kMaxClasses,
                "{}: target {} at {} would make {} classes, a model output each: class ids run "
                "0..C-1 (at most {}); renumber them (np.unique(y, return_inverse=True)), or read "
                "the targets as values (--task regress, TargetKind::regress)",
                name, v, rows(i), v + 1, kMaxClasses);
      top = std::max(top, v);
    }
    d.labels = ids.clone();
    d.num_classes = top + 1;
  } else {
    d.labels = y.to(DType::f32).reshape({n, y.numel() / n}).clone();
    check_finite(d.labels, name, "target", rows);
    d.num_classes = 0;
  }
  return d;
}

// Rows `rows` of x and y, and their names.
void take_split(const Tensor& x, const Tensor& y, const RowNames& names,
                const std::vector<int64_t>& rows, Tensor& x_out, Tensor& y_out,
                RowNames& names_out) {
  x_out = take_rows(x.cpu(), rows);
  y_out = take_rows(y.cpu(), rows);
  names_out = names.take(rows);
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
  // A directory of .npy files, x.npy or not (npy_dir_arrays names what is missing),
  // unless it holds Fashion-MNIST's IDX files (a stray .npy beside them).
  if (fs::is_directory(path, ec)) {
    if (fs::exists(fs::path(path) / "x.npy", ec)) return true;
    bool npy = false;
    for (const auto& e : fs::directory_iterator(path, ec)) {
      if (e.path().filename().string().find("-ubyte") != std::string::npos) return false;
      npy = npy || extension(e.path().string()) == ".npy";
    }
    return npy;
  }
  const std::string ext = extension(path);
  return ext == ".npz" || ext == ".csv" || ext == ".npy";
}

Dataset make_dataset(const Tensor& inputs, const Tensor& targets, const std::string& name,
                     TargetKind kind) {
  DDP_CHECK(targets.defined(), "{}: targets undefined", name);
  return build_dataset(inputs, targets, name, targets_are_classes(targets, kind), RowNames{}, "");
}

FileData load_file_data(const std::string& path, const FileDataOptions& o) {
  Arrays a = read_arrays(path, o);
  FileData out;
  const std::string base = fs::path(path).filename().string();
  for (const Tensor* t : {&a.x, &a.y}) {
    DDP_CHECK(t->dim() >= 1, "{}: {} is a single value (shape []): expected an array of rows", path,
              t == &a.x ? "x" : "y");
  }
  // Note [classification or regression]: the training targets decide, for every
  // split; the test set's rows must then be class ids too.
  const bool classes = targets_are_classes(a.y, o.kind);
  std::string test_name = base + "/test";
  bool held_out = false;
  if (!o.test_path.empty()) {
    std::error_code ec;
    DDP_CHECK(!fs::equivalent(path, o.test_path, ec),
              "--test-data {} is the training data {} itself: every test row would be a "
              "training row; give a test file of its own, or none (every 10th row is held out)",
              o.test_path, path);
    DDP_CHECK(!a.x_test.defined(),
              "{}: holds a test set (x_test, y_test) and a test file {} was given too: keep one",
              path, o.test_path);
    FileDataOptions test_options = o;
    test_options.kind = classes ? TargetKind::classify : TargetKind::regress;
    Arrays t = read_arrays(o.test_path, test_options, &a);
    DDP_CHECK(!t.x_test.defined(), "{}: the test file holds a test set of its own (x_test)",
              o.test_path);
    a.x_test = t.x;
    a.y_test = t.y;
    a.test_rows = t.rows;
    out.test_source = o.test_path;
    test_name = fs::path(o.test_path).filename().string();
  } else if (a.x_test.defined()) {
    out.test_source = "x_test/y_test";
  } else {
    // Note [held-out rows].
    const int64_t n = a.x.size(0);
    DDP_CHECK(a.y.size(0) == n,
              "{}: {} rows of inputs but {} of targets: they must have one target per row", path, n,
              a.y.size(0));
    DDP_CHECK(n >= 10,
              "{}: {} rows: holding every 10th row out as the test set needs at least 10; give "
              "a test set (x_test and y_test, or a test file)",
              path, n);
    std::vector<int64_t> train_rows, test_rows;
    for (int64_t i = 0; i < n; ++i) (i % 10 == 9 ? test_rows : train_rows).push_back(i);
    take_split(a.x, a.y, a.rows, test_rows, a.x_test, a.y_test, a.test_rows);
    take_split(a.x, a.y, a.rows, train_rows, a.x, a.y, a.rows);
    out.test_source = "every 10th row held out";
    held_out = true;
  }
  out.train = build_dataset(a.x, a.y, base + "/train", classes, a.rows, "");
  const std::string hint =
      classes && o.kind == TargetKind::auto_detect
          ? fmt::format(
                ", while the training targets are class ids 0..{}: fix that row, or "
                "read every target as a value (--task regress, TargetKind::regress)",
                out.train.num_classes - 1)
          : "";
  out.test = build_dataset(a.x_test, a.y_test, test_name, classes, a.test_rows, hint);
  // A test set of its own with a class no training row has (an off-by-one encoding,
  // say) widened the model to it and scored it with exit 0: refused. Rows held out of
  // one file may hold a class the others lack; the model gets an output for it.
  if (classes && !held_out && out.test.num_classes > out.train.num_classes) {
    const auto ids = out.test.labels.to_vector<int64_t>();
    const auto it =
        std::find_if(ids.begin(), ids.end(), [&](int64_t v) { return v >= out.train.num_classes; });
    throw ValueError(fmt::format(
        "{}: target {} at {} is a class no training row has (the training targets are class "
        "ids 0..{}): the model could never predict it. Check that both sets number the classes "
        "alike",
        test_name, *it, a.test_rows(it - ids.begin()), out.train.num_classes - 1));
  }
  const int64_t num_classes = std::max(out.train.num_classes, out.test.num_classes);
  out.train.num_classes = out.test.num_classes = num_classes;
  check_same_task(out.train, out.test, path);
  return out;
}

void check_same_task(const Dataset& train, const Dataset& test, const std::string& name) {
  for (const Dataset* d : {&train, &test}) {
    DDP_CHECK(d->inputs.defined() && d->labels.defined() && d->inputs.dim() >= 1 &&
                  d->labels.dim() >= 1 && d->inputs.size(0) == d->labels.size(0) && d->size() > 0,
              "{}: the {} set needs inputs [N, ...] and labels [N, ...] with N >= 1 (make_dataset "
              "in runtime/data/file_dataset.h builds one from tensors)",
              name, d == &train ? "training" : "test");
  }
  const Shape& a = train.inputs.shape();
  const Shape& b = test.inputs.shape();
  DDP_CHECK(a.size() == b.size() && std::equal(a.begin() + 1, a.end(), b.begin() + 1),
            "{}: the training inputs are {} and the test inputs {}: a row must have the same shape "
            "in both",
            name, shape_str(a), shape_str(b));
  const bool classes = train.num_classes > 0;
  DDP_CHECK(classes == (test.num_classes > 0),
            "{}: the training set is {} (num_classes {}) and the test set {} (num_classes {}): "
            "both must be the same task",
            name, classes ? "a classification" : "a regression", train.num_classes,
            test.num_classes > 0 ? "a classification" : "a regression", test.num_classes);
  if (classes) {
    for (const Dataset* d : {&train, &test}) {
      DDP_CHECK(d->labels.dtype() == DType::i64 && d->labels.numel() == d->size(),
                "{}: the {} labels are {} ({}): classification needs one i64 class id per row "
                "([N])",
                name, d == &train ? "training" : "test", shape_str(d->labels.shape()),
                dtype_name(d->labels.dtype()));
    }
    DDP_CHECK(test.num_classes <= train.num_classes,
              "{}: the test set has {} classes and the training set {}: the model has an output "
              "per training class; give both sets the larger num_classes",
              name, test.num_classes, train.num_classes);
  } else {
    const int64_t cols = train.labels.numel() / train.size();
    const int64_t test_cols = test.labels.numel() / test.size();
    DDP_CHECK(cols == test_cols,
              "{}: the training targets are {} ({} per row) and the test targets {} ({} per "
              "row): they must match",
              name, shape_str(train.labels.shape()), cols, shape_str(test.labels.shape()),
              test_cols);
  }
}

}  // namespace ddp
