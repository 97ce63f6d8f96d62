#include "runtime/data/idx.h"

#include "runtime/error.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ddp {
namespace {

namespace fs = std::filesystem;

class IdxFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ddp_idx_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_gz(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    gzFile f = gzopen(path.c_str(), "wb");
    EXPECT_NE(f, nullptr);
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(f);
    return path;
  }
  std::string write_raw(const std::string& name, const std::vector<uint8_t>& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  fs::path dir_;
};

// A big-endian IDX header followed by `body` bytes.
std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, size_t body) {
  std::vector<uint8_t> out;
  auto put = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
  };
  put(magic);
  for (uint32_t d : dims) put(d);
  for (size_t i = 0; i < body; ++i) out.push_back(static_cast<uint8_t>(i * 7));
  return out;
}

std::string error_of(const std::string& path) {
  try {
    read_idx(path);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(IdxFiles, ReadsGzipAndUncompressedImagesAndLabels) {
  const auto images = idx_bytes(kIdxMagicImages, {2, 3, 4}, 24);
  for (const std::string& path : {write_gz("img.gz", images), write_raw("img", images)}) {
    const IdxArray a = read_idx(path);
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4})) << path;
    ASSERT_EQ(a.data.size(), 24u);
    for (size_t i = 0; i < 24; ++i) EXPECT_EQ(a.data[i], static_cast<uint8_t>(i * 7)) << i;
  }
  const IdxArray labels = read_idx(write_gz("lab.gz", idx_bytes(kIdxMagicLabels, {5}, 5)));
  EXPECT_EQ(labels.dims, (std::vector<int64_t>{5}));
  EXPECT_EQ(labels.data, (std::vector<uint8_t>{0, 7, 14, 21, 28}));
}

TEST_F(IdxFiles, TruncatedBodyNamesTheFileAndTheSizes) {
  const std::string path =
      write_gz("train-images-idx3-ubyte.gz", idx_bytes(kIdxMagicImages, {3, 28, 28}, 100));
  EXPECT_EQ(error_of(path),
            path + ": truncated: header says 3x28x28 = 2352 bytes of pixels, file has 100");
  const std::string labels = write_raw("labels", idx_bytes(kIdxMagicLabels, {10}, 4));
  EXPECT_EQ(error_of(labels),
            labels + ": truncated: header says 10 = 10 bytes of labels, file has 4");
}

TEST_F(IdxFiles, TruncatedHeaders) {
  const std::string empty = write_raw("empty", {});
  EXPECT_EQ(error_of(empty),
            empty + ": truncated: an IDX file starts with a 4-byte magic number, file has 0 bytes");
  auto bytes = idx_bytes(kIdxMagicImages, {3, 28, 28}, 0);
  bytes.resize(9);
  const std::string short_dims = write_raw("short", bytes);
  EXPECT_EQ(error_of(short_dims), short_dims +
                                      ": truncated: magic 0x00000803 announces 3 dimension sizes "
                                      "(12 bytes), file has 5");
}

TEST_F(IdxFiles, CutGzipStreamIsReportedAsTruncated) {
  const std::string path = write_gz("cut.gz", idx_bytes(kIdxMagicImages, {4, 28, 28}, 4 * 28 * 28));
  const auto size = fs::file_size(path);
  fs::resize_file(path, size / 2);
  const std::string msg = error_of(path);
  EXPECT_NE(msg.find(path + ": truncated: header says 4x28x28 = 3136 bytes of pixels, file has"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("(gzip: unexpected end of file)"), std::string::npos) << msg;
}

TEST_F(IdxFiles, CorruptGzipTrailerIsReported) {
  const std::string path = write_gz("crc.gz", idx_bytes(kIdxMagicLabels, {50}, 50));
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-8, std::ios::end);  // the CRC-32 of the gzip trailer
  f.put('\x5a');
  f.close();
  const std::string msg = error_of(path);
  EXPECT_NE(msg.find(path + ": corrupt gzip stream: "), std::string::npos) << msg;
}

TEST_F(IdxFiles, WrongMagicSaysWhatWasExpected) {
  const std::string path = write_gz("bad.gz", idx_bytes(0x00000804, {1, 1, 1, 1}, 1));
  EXPECT_EQ(error_of(path), path +
                                ": not an IDX file of u8 images or labels: magic number is "
                                "0x00000804, expected 0x00000803 (images) or 0x00000801 (labels)");
  const std::string floats = write_gz("f32.gz", idx_bytes(0x00000D03, {1, 1, 1}, 4));
  EXPECT_NE(error_of(floats).find("data type 0x0d is not supported, only 0x08 (u8)"),
            std::string::npos)
      << error_of(floats);
  const std::string text = write_raw("text", {'h', 'e', 'l', 'l', 'o', '\n'});
  EXPECT_NE(error_of(text).find("magic number is 0x68656c6c"), std::string::npos);
}

TEST_F(IdxFiles, ExtraBytesAreAnError) {
  auto bytes = idx_bytes(kIdxMagicLabels, {3}, 5);
  const std::string path = write_gz("long.gz", bytes);
  EXPECT_EQ(error_of(path),
            path + ": too long: header says 3 = 3 bytes of labels, file has 5 (2 extra)");
}

TEST_F(IdxFiles, MissingFileAndDirectory) {
  const std::string missing = (dir_ / "nope.gz").string();
  EXPECT_EQ(error_of(missing), missing + ": file not found");
  EXPECT_NE(error_of(dir_.string()).find("is a directory"), std::string::npos);
}

TEST(Idx, RealFashionMnistTestSplit) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/t10k-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST is not installed in " << dir
                 << " (apt-get install dataset-fashion-mnist)";
  }
  const IdxArray images = read_idx(dir + "/t10k-images-idx3-ubyte.gz");
  const IdxArray labels = read_idx(dir + "/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(images.dims, (std::vector<int64_t>{10000, 28, 28}));
  EXPECT_EQ(images.data.size(), 10000u * 28 * 28);
  EXPECT_EQ(labels.dims, (std::vector<int64_t>{10000}));
  std::vector<int> counts(10, 0);
  for (uint8_t l : labels.data) {
    ASSERT_LT(l, 10);
    ++counts[l];
  }
  for (int c : counts) EXPECT_EQ(c, 1000);  // the test split is balanced
}

}  // namespace
}  // namespace ddp
