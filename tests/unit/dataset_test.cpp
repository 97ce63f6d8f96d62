#include "runtime/data/dataset.h"

#include "runtime/data/idx.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <limits>

namespace ddp {
namespace {

namespace fs = std::filesystem;

using test_util::error_text;

// Index of the row of `centers` [C, D] nearest to x (squared Euclidean distance).
int64_t nearest(const float* x, const std::vector<float>& centers, int64_t classes, int64_t d) {
  int64_t best = -1;
  double best_dist = std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < classes; ++c) {
    double dist = 0;
    for (int64_t j = 0; j < d; ++j) {
      const double diff = x[j] - centers[static_cast<size_t>(c * d + j)];
      dist += diff * diff;
    }
    if (dist < best_dist) best_dist = dist, best = c;
  }
  return best;
}

double nearest_center_accuracy(const Dataset& ds, const std::vector<float>& centers) {
  const int64_t d = ds.inputs.numel() / ds.size();
  const float* x = ds.inputs.data<float>();
  const int64_t* y = ds.labels.data<int64_t>();
  int64_t correct = 0;
  for (int64_t i = 0; i < ds.size(); ++i)
    correct += nearest(x + i * d, centers, ds.num_classes, d) == y[i];
  return static_cast<double>(correct) / static_cast<double>(ds.size());
}

TEST(Dataset, SyntheticShapesAndLabels) {
  const Dataset ds = make_synthetic({.n = 500, .seed = 3});
  EXPECT_EQ(ds.inputs.shape(), (Shape{500, 1, 28, 28}));
  EXPECT_EQ(ds.inputs.dtype(), DType::f32);
  EXPECT_EQ(ds.labels.shape(), (Shape{500}));
  EXPECT_EQ(ds.labels.dtype(), DType::i64);
  EXPECT_EQ(ds.num_classes, 10);
  EXPECT_EQ(ds.name, "synthetic/train");
  std::vector<int> counts(10, 0);
  for (int64_t y : ds.labels.to_vector<int64_t>()) {
    ASSERT_GE(y, 0);
    ASSERT_LT(y, 10);
    ++counts[static_cast<size_t>(y)];
  }
  for (int c : counts) EXPECT_GT(c, 20) << "labels should be roughly uniform";
  const Dataset flat = make_synthetic({.n = 7, .num_classes = 3, .shape = {5}});
  EXPECT_EQ(flat.inputs.shape(), (Shape{7, 5}));
}

TEST(Dataset, SyntheticIsDeterministicPerSeedAndSplit) {
  const SyntheticOptions o{.n = 64, .shape = {12}, .seed = 11};
  const Dataset a = make_synthetic(o), b = make_synthetic(o);
  EXPECT_EQ(a.inputs.to_vector<float>(), b.inputs.to_vector<float>());
  EXPECT_EQ(a.labels.to_vector<int64_t>(), b.labels.to_vector<int64_t>());
  SyntheticOptions other = o;
  other.seed = 12;
  EXPECT_NE(a.inputs.to_vector<float>(), make_synthetic(other).inputs.to_vector<float>());
  SyntheticOptions test = o;
  test.split = Split::test;
  const Dataset t = make_synthetic(test);
  EXPECT_EQ(t.name, "synthetic/test");
  EXPECT_NE(a.inputs.to_vector<float>(), t.inputs.to_vector<float>());
  EXPECT_NE(a.labels.to_vector<int64_t>(), t.labels.to_vector<int64_t>());
}

TEST(Dataset, SyntheticSamplesAreTemplatesPlusNoise) {
  // Note [synthetic data]: with noise 0 every sample is its class template, row
  // y of randn([C, D], seed); train and test share the templates.
  const int64_t d = 6, classes = 4;
  const auto templates = randn({classes, d}, 5).to_vector<float>();
  for (Split split : {Split::train, Split::test}) {
    const Dataset ds = make_synthetic(
        {.n = 40, .num_classes = classes, .shape = {d}, .seed = 5, .noise = 0.0f, .split = split});
    const auto x = ds.inputs.to_vector<float>();
    const auto y = ds.labels.to_vector<int64_t>();
    for (int64_t i = 0; i < 40; ++i) {
      for (int64_t j = 0; j < d; ++j) {
        ASSERT_EQ(x[static_cast<size_t>(i * d + j)],
                  templates[static_cast<size_t>(y[static_cast<size_t>(i)] * d + j)])
            << "sample " << i << " element " << j;
      }
    }
  }
}

TEST(Dataset, SyntheticIsLearnableAtLowNoise) {
  const SyntheticOptions train_options{.n = 2000, .shape = {1, 8, 8}, .seed = 1, .noise = 2.0f};
  const Dataset train = make_synthetic(train_options);
  SyntheticOptions test_options = train_options;
  test_options.split = Split::test;
  test_options.n = 1000;
  const Dataset test = make_synthetic(test_options);
  const int64_t d = 64;
  // The true templates classify almost perfectly...
  const auto templates = randn({10, d}, 1).to_vector<float>();
  EXPECT_GT(nearest_center_accuracy(test, templates), 0.9);
  // ...and so do class means learned from the train split, applied to the test split.
  std::vector<float> means(static_cast<size_t>(10 * d), 0.0f);
  std::vector<int> counts(10, 0);
  const float* x = train.inputs.data<float>();
  const int64_t* y = train.labels.data<int64_t>();
  for (int64_t i = 0; i < train.size(); ++i) {
    ++counts[static_cast<size_t>(y[i])];
    for (int64_t j = 0; j < d; ++j) means[static_cast<size_t>(y[i] * d + j)] += x[i * d + j];
  }
  for (int64_t c = 0; c < 10; ++c) {
    for (int64_t j = 0; j < d; ++j)
      means[static_cast<size_t>(c * d + j)] /= static_cast<float>(counts[static_cast<size_t>(c)]);
  }
  EXPECT_GT(nearest_center_accuracy(test, means), 0.9);
  // Very high noise is not learnable: a test that cannot fail would prove nothing.
  test_options.noise = 50.0f;
  EXPECT_LT(nearest_center_accuracy(make_synthetic(test_options), templates), 0.5);
}

TEST(Dataset, SyntheticRejectsBadOptions) {
  EXPECT_THROW(make_synthetic({.n = -1}), ValueError);
  EXPECT_THROW(make_synthetic({.num_classes = 0}), ValueError);
  EXPECT_THROW(make_synthetic({.shape = {1, 0, 28}}), ValueError);
  EXPECT_THROW(make_synthetic({.noise = -1.0f}), ValueError);
  EXPECT_EQ(make_synthetic({.n = 0}).size(), 0);
}

TEST(Dataset, MissingFashionMnistSaysHowToGetIt) {
  const std::string msg =
      error_text([] { load_fashion_mnist("/nonexistent/fashion", Split::train); });
  EXPECT_NE(msg.find("'/nonexistent/fashion' does not exist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--data synthetic"), std::string::npos) << msg;
}

void write_idx_gz(const fs::path& path, uint32_t magic, const std::vector<uint32_t>& dims,
                  uint8_t value) {
  std::vector<uint8_t> bytes;
  auto put = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) bytes.push_back(static_cast<uint8_t>(v >> s));
  };
  put(magic);
  size_t n = 1;
  for (uint32_t d : dims) put(d), n *= d;
  bytes.insert(bytes.end(), n, value);
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

TEST(Dataset, FashionMnistFromFilesNormalizesAndChecksCounts) {
  std::string tmpl = (fs::temp_directory_path() / "ddp_fmnist_test.XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const fs::path dir = tmpl;
  const std::string empty_dir = error_text([&] { load_fashion_mnist(dir.string(), Split::test); });
  EXPECT_NE(empty_dir.find("has no t10k-images-idx3-ubyte.gz"), std::string::npos) << empty_dir;
  EXPECT_NE(empty_dir.find("apt-get install dataset-fashion-mnist"), std::string::npos)
      << empty_dir;
  write_idx_gz(dir / "t10k-images-idx3-ubyte.gz", kIdxMagicImages, {3, 28, 28}, 255);
  write_idx_gz(dir / "t10k-labels-idx1-ubyte.gz", kIdxMagicLabels, {3}, 9);
  const Dataset ds = load_fashion_mnist(dir.string(), Split::test);
  EXPECT_EQ(ds.inputs.shape(), (Shape{3, 1, 28, 28}));
  EXPECT_EQ(ds.name, "fashion-mnist/test");
  EXPECT_NEAR(ds.inputs.to_vector<float>()[0], (1.0f - 0.2860f) / 0.3530f, 1e-5f);
  EXPECT_EQ(ds.labels.to_vector<int64_t>(), (std::vector<int64_t>{9, 9, 9}));
  write_idx_gz(dir / "t10k-labels-idx1-ubyte.gz", kIdxMagicLabels, {2}, 1);
  const std::string msg = error_text([&] { load_fashion_mnist(dir.string(), Split::test); });
  EXPECT_NE(msg.find("3 images but 2 labels"), std::string::npos) << msg;
  write_idx_gz(dir / "t10k-labels-idx1-ubyte.gz", kIdxMagicLabels, {3}, 10);
  const std::string bad_label = error_text([&] { load_fashion_mnist(dir.string(), Split::test); });
  EXPECT_NE(bad_label.find("label 10 at index 0 is not a class 0..9"), std::string::npos)
      << bad_label;
  fs::remove_all(dir);
}

TEST(Dataset, RealFashionMnist) {
  if (!fs::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed in " << kFashionMnistDir
                 << " (apt-get install dataset-fashion-mnist)";
  }
  const Dataset train = load_fashion_mnist(kFashionMnistDir, Split::train);
  EXPECT_EQ(train.inputs.shape(), (Shape{60000, 1, 28, 28}));
  EXPECT_EQ(train.labels.shape(), (Shape{60000}));
  // Normalized with the training set's own statistics: mean ~0, std ~1.
  const auto x = train.inputs.to_vector<float>();
  double sum = 0, sum_sq = 0;
  for (float v : x) sum += v, sum_sq += static_cast<double>(v) * v;
  const double mean = sum / static_cast<double>(x.size());
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum_sq / static_cast<double>(x.size()) - mean * mean), 1.0, 0.01);
  const Dataset test = load_fashion_mnist(kFashionMnistDir, Split::test);
  EXPECT_EQ(test.size(), 10000);
}

}  // namespace
}  // namespace ddp
