// Data sets of one's own from files: NumPy arrays (.npz, or a directory of .npy
// files) and CSV tables, as the train and test Datasets the DataLoader takes.
//
//   x.npz               arrays x (inputs) and y (targets); x_test and y_test, when
//                       present, are the test set (np.savez(path, x=..., y=...))
//   DIR/                the same arrays as DIR/x.npy, DIR/y.npy [, x_test.npy, y_test.npy]
//   table.csv           a header line, then numbers; targets: the last column
//                       unless target_columns names others; inputs: the other
//                       columns unless input_columns names them
//
// Note [held-out rows]: without a test set (no x_test, no test_path), every
// tenth row (rows 9, 19, 29, ...) is held out as the test set and the rest train:
// deterministic, the same on every rank and every run, and fair to a file
// sorted by class, where "the last 10%" would hold one class.
//
// Note [classification or regression]: kind auto makes targets class ids when
// they are one integer column (an integer dtype, or a CSV column of whole
// numbers) of values >= 0: Dataset::num_classes = the largest + 1, the loss is
// cross-entropy and the evaluation accuracy. Otherwise (floating targets, or
// several columns) it is a regression: targets f32 [N, k] (a 1-D y becomes
// [N, 1]), num_classes 0, the loss MSE. Integer targets meant as values (counts,
// years) need kind regress. The training targets decide for the test set too: a
// test target that is not a class id, where the training targets are, is an error
// naming its row (not a silent switch to regression). Class ids must be below
// 2^20 (Note [how many classes] in file_dataset.cpp). A test CSV is read by the
// training CSV's column names, in whatever order it has them. Inputs become f32 [N, D] (1-D: [N,
// 1]) or, for image arrays, [N, C, H, W] ([N, H, W]: one channel); integer inputs are converted as
// they are (u8 pixels stay 0..255: scale them in the file if the model wants 0..1).
#pragma once

#include "runtime/data/dataset.h"

#include <string>
#include <vector>

namespace ddp {

enum class TargetKind { auto_detect, classify, regress };
// "auto", "classify", "regress"; ValueError naming them otherwise.
TargetKind parse_target_kind(const std::string& text);

struct FileDataOptions {
  std::vector<std::string> input_columns = {};   // CSV only; empty: every non-target column
  std::vector<std::string> target_columns = {};  // CSV only; empty: the last column
  TargetKind kind = TargetKind::auto_detect;
  std::string test_path = {};  // a second file of the same form as the test set; empty: see above
};

struct FileData {
  Dataset train, test;
  std::string test_source;  // "x_test/y_test", "test.csv", "every 10th row held out"
};

// Whether `path` names data this file reads: an .npz or .csv file (the extension
// in any case), or a directory holding .npy files. (The Fashion-MNIST directory
// and "synthetic" are not.)
bool is_file_data(const std::string& path);

// Reads the train and test sets. ValueError for any malformed file (npy.h, csv.h),
// a missing array or column (naming those there are), inputs and targets of
// different lengths, a target that is not a class id where the training targets
// are (named by its CSV line or array index, y[i]), or inputs of more than 4
// dimensions.
FileData load_file_data(const std::string& path, const FileDataOptions& options = {});

// ValueError naming `name` unless train and test are one task: rows of one input
// shape, both classification (one i64 class id per row) or both regression with
// as many targets per row.
void check_same_task(const Dataset& train, const Dataset& test, const std::string& name);

// A Dataset from arrays in memory, by Note [classification or regression]; the
// shapes and dtypes normalized as load_file_data does. `name` is for messages.
Dataset make_dataset(const Tensor& inputs, const Tensor& targets, const std::string& name,
                     TargetKind kind = TargetKind::auto_detect);

}  // namespace ddp
