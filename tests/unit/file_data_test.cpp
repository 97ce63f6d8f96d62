// Data files of one's own: .npy/.npz (npy.h), CSV (csv.h) and the Datasets made
// from them (file_dataset.h). The files are built byte by byte here, so every
// expected value is independent of the reader; tests/e2e/file_data.sh reads
// what NumPy itself writes.
#include "runtime/data/csv.h"
#include "runtime/data/file_dataset.h"
#include "runtime/data/npy.h"
#include "runtime/fmt.h"
#include "tests/unit/error_text.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

namespace ddp {
namespace {

namespace fs = std::filesystem;

using test_util::error_text;

using Bytes = std::vector<uint8_t>;

// An .npy of version 1.0 with the given header dict and body, padded as np.save pads.
Bytes npy_bytes(const std::string& dict, const Bytes& body) {
  std::string header = dict;
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  const uint8_t magic[10] = {0x93,
                             'N',
                             'U',
                             'M',
                             'P',
                             'Y',
                             1,
                             0,
                             static_cast<uint8_t>(header.size() & 0xFF),
                             static_cast<uint8_t>(header.size() >> 8)};
  // Sized once and filled with memcpy (GCC 12 -O3 warns falsely on growing inserts).
  Bytes b(sizeof(magic) + header.size() + body.size());
  std::memcpy(b.data(), magic, sizeof(magic));
  std::memcpy(b.data() + sizeof(magic), header.data(), header.size());
  if (!body.empty())
    std::memcpy(b.data() + sizeof(magic) + header.size(), body.data(), body.size());
  return b;
}

template <typename T>
Bytes le_bytes(const std::vector<T>& values) {
  Bytes b(values.size() * sizeof(T));
  std::memcpy(b.data(), values.data(), b.size());
  return b;
}

void put16(Bytes& b, uint32_t v) {
  b.push_back(static_cast<uint8_t>(v));
  b.push_back(static_cast<uint8_t>(v >> 8));
}
void put32(Bytes& b, uint32_t v) {
  put16(b, v & 0xFFFF);
  put16(b, v >> 16);
}

Bytes deflated(const Bytes& data) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&z, data.size()));
  z.next_in = const_cast<Bytef*>(data.data());
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// A ZIP archive of (name, content) members, stored (method 0) or deflated (8).
Bytes zip_bytes(const std::vector<std::pair<std::string, Bytes>>& members, bool deflate) {
  Bytes out, directory;
  for (const auto& [name, content] : members) {
    const Bytes packed = deflate ? deflated(content) : content;
    const auto crc =
        static_cast<uint32_t>(crc32(0L, content.data(), static_cast<uInt>(content.size())));
    const auto offset = static_cast<uint32_t>(out.size());
    for (Bytes* b : {&out, &directory}) {
      const bool central = b == &directory;
      put32(*b, central ? 0x02014b50 : 0x04034b50);
      if (central) put16(*b, 20);  // version made by
      put16(*b, 20);               // version needed
      put16(*b, 0);                // flags
      put16(*b, deflate ? 8 : 0);
      put32(*b, 0);  // time, date
      put32(*b, crc);
      put32(*b, static_cast<uint32_t>(packed.size()));
      put32(*b, static_cast<uint32_t>(content.size()));
      put16(*b, static_cast<uint32_t>(name.size()));
      put16(*b, 0);  // extra
      if (central) {
        put16(*b, 0);  // comment
        put16(*b, 0);  // disk
        put16(*b, 0);  // internal attributes
        put32(*b, 0);  // external attributes
        put32(*b, offset);
      }
      b->insert(b->end(), name.begin(), name.end());
    }
    out.insert(out.end(), packed.begin(), packed.end());
  }
  const auto dir_offset = static_cast<uint32_t>(out.size());
  out.insert(out.end(), directory.begin(), directory.end());
  put32(out, 0x06054b50);
  put16(out, 0);
  put16(out, 0);
  put16(out, static_cast<uint32_t>(members.size()));
  put16(out, static_cast<uint32_t>(members.size()));
  put32(out, static_cast<uint32_t>(directory.size()));
  put32(out, dir_offset);
  put16(out, 0);
  return out;
}

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ddp_file_data_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const Bytes& bytes) {
    const auto path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  std::string write(const std::string& name, const std::string& text) {
    return write(name, Bytes(text.begin(), text.end()));
  }
  fs::path dir_;
};

TEST_F(DataFiles, NpyReadsTheRuntimeDtypesAsTheyAre) {
  const Tensor f =
      parse_npy(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                          le_bytes<float>({1, 2, 3, 4, 5, -6.5f})),
                "f.npy");
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_EQ(f.shape(), (Shape{2, 3}));
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, -6.5f}));
  const Tensor i = parse_npy(npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }",
                                       le_bytes<int64_t>({-1, 0, int64_t{1} << 40})),
                             "i.npy");
  EXPECT_EQ(i.dtype(), DType::i64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{-1, 0, int64_t{1} << 40}));
  const Tensor scalar = parse_npy(
      npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (), }", le_bytes<int32_t>({7})),
      "s.npy");
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.to_vector<int32_t>(), (std::vector<int32_t>{7}));
}

TEST_F(DataFiles, NpyConvertsTheOtherDtypesKeepingTheValue) {
  // Big-endian float64: 1.5 and -0.25 with their bytes reversed.
  Bytes be;
  for (double v : {1.5, -0.25}) {
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
    for (int b = 7; b >= 0; --b) be.push_back(static_cast<uint8_t>(bits >> (8 * b)));
  }
  const Tensor d = parse_npy(
      npy_bytes("{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", be), "d.npy");
  EXPECT_EQ(d.dtype(), DType::f32);
  EXPECT_EQ(d.to_vector<float>(), (std::vector<float>{1.5f, -0.25f}));
  const Tensor i1 = parse_npy(
      npy_bytes("{'descr': '|i1', 'fortran_order': False, 'shape': (2,), }", Bytes{0xFF, 0x05}),
      "i1.npy");
  EXPECT_EQ(i1.to_vector<int64_t>(), (std::vector<int64_t>{-1, 5}));
  const Tensor u2 = parse_npy(
      npy_bytes("{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }", Bytes{0xFF, 0xFF}),
      "u2.npy");
  EXPECT_EQ(u2.to_vector<int64_t>(), (std::vector<int64_t>{65535}));
  const Tensor b1 = parse_npy(
      npy_bytes("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", Bytes{0, 1, 2}),
      "b.npy");
  EXPECT_EQ(b1.dtype(), DType::u8);
  EXPECT_EQ(b1.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 1}));
}

TEST_F(DataFiles, NpyRefusesWhatItCannotReadAndNamesTheFileAndOffset) {
  const auto parse = [](const Bytes& b) { return error_text([&] { parse_npy(b, "bad.npy"); }); };
  EXPECT_NE(parse(Bytes{'P', 'K', 3, 4, 0, 0, 0, 0, 0, 0, 0}).find("bad.npy: not a .npy file"),
            std::string::npos);
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }";
  const Bytes short_body = npy_bytes(dict, le_bytes<float>({1, 2, 3}));
  const std::string truncated = parse(short_body);
  EXPECT_NE(truncated.find("truncated at byte 140"), std::string::npos) << truncated;
  EXPECT_NE(truncated.find("needs 16 bytes"), std::string::npos) << truncated;
  EXPECT_NE(parse(npy_bytes(dict, le_bytes<float>({1, 2, 3, 4, 5}))).find("trailing bytes"),
            std::string::npos);
  EXPECT_NE(parse(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
                            le_bytes<float>({1})))
                .find("np.ascontiguousarray"),
            std::string::npos);
  EXPECT_NE(parse(npy_bytes("{'descr': '<u8', 'fortran_order': False, 'shape': (1,), }",
                            le_bytes<uint64_t>({1})))
                .find("astype(np.int64)"),
            std::string::npos);
  EXPECT_NE(parse(npy_bytes("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
                            le_bytes<uint64_t>({1})))
                .find("complex"),
            std::string::npos);
  // A shape whose count wraps around 2^64 to a small one is refused, not read.
  EXPECT_NE(parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': "
                            "(4611686018427387904, 4), }",
                            Bytes{}))
                .find("more elements than a 64-bit count holds"),
            std::string::npos);
  // So is one whose count fits but whose bytes wrap around to 0: 2^62 '<f4' and no body.
  const std::string bytes_wrap = parse(npy_bytes(
      "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904,), }", Bytes{}));
  EXPECT_NE(bytes_wrap.find("bad.npy: shape [4611686018427387904] of '<f4' has more bytes"),
            std::string::npos)
      << bytes_wrap;
  const std::string header =
      parse(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", Bytes{}));
  EXPECT_NE(header.find("malformed .npy header at byte 64"), std::string::npos) << header;
  EXPECT_NE(parse(npy_bytes("{'descr': '<f4', 'shape': (1,), }", le_bytes<float>({1})))
                .find("'fortran_order' is missing"),
            std::string::npos);
}

TEST_F(DataFiles, WriteNpyRoundTripsEveryDtype) {
  const Tensor f = from_vector<float>({1, -2, 3.5f, 4, 5, 6}, {3, 2});
  const auto path = (dir_ / "f.npy").string();
  write_npy(path, f);
  const Tensor back = read_npy(path);
  EXPECT_EQ(back.shape(), f.shape());
  EXPECT_EQ(back.to_vector<float>(), f.to_vector<float>());
  // The header is np.save's form: a multiple of 64 bytes in all.
  EXPECT_EQ(fs::file_size(path) % 64, 24u);  // 64 + 6 floats = 24 bytes past a multiple of 64
  const Tensor i = from_vector<int64_t>({5, -7}, {2}, {.dtype = DType::i64});
  write_npy(path, i);
  EXPECT_EQ(read_npy(path).to_vector<int64_t>(), (std::vector<int64_t>{5, -7}));
  EXPECT_NE(error_text([&] { write_npy(path, f.to(DType::bf16)); }).find("no bfloat16"),
            std::string::npos);
}

TEST_F(DataFiles, NpzReadsStoredAndDeflatedMembersAndChecksTheirCrc) {
  const Bytes x = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                            le_bytes<float>({0.5f, 1.5f}));
  const Bytes y = npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                            le_bytes<int64_t>({3, 4}));
  for (bool deflate : {false, true}) {
    const auto path =
        write(deflate ? "c.npz" : "s.npz", zip_bytes({{"x.npy", x}, {"y.npy", y}}, deflate));
    const auto arrays = read_npz(path);
    ASSERT_EQ(arrays.size(), 2u);
    EXPECT_EQ(arrays.at("x").to_vector<float>(), (std::vector<float>{0.5f, 1.5f}));
    EXPECT_EQ(arrays.at("y").to_vector<int64_t>(), (std::vector<int64_t>{3, 4}));
  }
  // One flipped byte inside the stored x: its CRC names the member.
  Bytes corrupt = zip_bytes({{"x.npy", x}}, false);
  corrupt[30 + 5 + x.size() - 1] ^= 0x40;
  const std::string crc = error_text([&] { read_npz(write("bad.npz", corrupt)); });
  EXPECT_NE(crc.find("member 'x.npy': CRC-32 mismatch"), std::string::npos) << crc;
  const std::string zip = error_text([&] { read_npz(write("not.npz", x)); });
  EXPECT_NE(zip.find("not a ZIP archive"), std::string::npos) << zip;
}

TEST_F(DataFiles, CsvReadsNumbersUnderAHeader) {
  const CsvTable t = parse_csv("a, \"b,c\" ,y\r\n1, 2.5 ,0\n\n-3,1e-3,\"2\"\r\n", "t.csv");
  EXPECT_EQ(t.columns, (std::vector<std::string>{"a", "b,c", "y"}));
  EXPECT_EQ(t.rows, 2);
  EXPECT_EQ(t.values, (std::vector<double>{1, 2.5, 0, -3, 1e-3, 2}));
  EXPECT_TRUE(t.all_integers({"y"}, "t.csv"));
  EXPECT_FALSE(t.all_integers({"b,c"}, "t.csv"));
  const Tensor ids = t.take({"y"}, DType::i64, "t.csv");
  EXPECT_EQ(ids.to_vector<int64_t>(), (std::vector<int64_t>{0, 2}));
  const Tensor x = t.take({"b,c", "a"}, DType::f32, "t.csv");
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{2.5f, 1, 1e-3f, -3}));
}

TEST_F(DataFiles, CsvErrorsNameTheLineAndColumn) {
  const auto parse = [](const std::string& text) {
    return error_text([&] { parse_csv(text, "t.csv"); });
  };
  EXPECT_NE(parse("a,b\n1,\n").find("t.csv:2: column 'b' is empty"), std::string::npos);
  EXPECT_NE(parse("a,b\n1,2\n3,red\n").find("t.csv:3: column 'b' holds 'red'"), std::string::npos);
  EXPECT_NE(parse("a,b\n1,2,3\n").find("t.csv:2: 3 fields where the header names 2 columns"),
            std::string::npos);
  EXPECT_NE(parse("1,2\n3,4\n").find("needs a header line"), std::string::npos);
  EXPECT_NE(parse("a,b\n").find("no rows"), std::string::npos);
  EXPECT_NE(parse("a,a\n1,2\n").find("'a' appears twice"), std::string::npos);
  const CsvTable t = parse_csv("a,b\n1,2\n", "t.csv");
  EXPECT_NE(
      error_text([&] { t.index_of("c", "t.csv"); }).find("no column 'c'; its columns are a, b"),
      std::string::npos);
}

TEST_F(DataFiles, IntegerTargetsAreClassesAndFloatsAreValues) {
  const Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  const Dataset c =
      make_dataset(x, from_vector<int64_t>({0, 4, 2}, {3}, {.dtype = DType::i64}), "c");
  EXPECT_EQ(c.num_classes, 5);
  EXPECT_EQ(c.labels.dtype(), DType::i64);
  const Dataset r = make_dataset(x, from_vector<float>({0.5f, 1, 2}, {3}), "r");
  EXPECT_EQ(r.num_classes, 0);
  EXPECT_EQ(r.labels.shape(), (Shape{3, 1}));
  // Negative integers cannot be class ids: values; and kind regress keeps ids as values.
  EXPECT_EQ(make_dataset(x, from_vector<int64_t>({0, -1, 2}, {3}, {.dtype = DType::i64}), "n")
                .num_classes,
            0);
  EXPECT_EQ(make_dataset(x, from_vector<int64_t>({0, 1, 2}, {3}, {.dtype = DType::i64}), "k",
                         TargetKind::regress)
                .num_classes,
            0);
  EXPECT_NE(error_text([&] {
              make_dataset(x, from_vector<float>({0.5f, 1, 2}, {3}), "f", TargetKind::classify);
            }).find("target 0.5 at row 0 is not a class id"),
            std::string::npos);
  EXPECT_NE(error_text([&] {
              make_dataset(x, from_vector<float>({1, 2}, {2}), "m");
            }).find("3 rows of inputs [3, 2] but 2 of targets [2]"),
            std::string::npos);
  // [N, H, W] images get their channel.
  EXPECT_EQ(
      make_dataset(zeros({3, 4, 5}), from_vector<float>({1, 2, 3}, {3}), "img").inputs.shape(),
      (Shape{3, 1, 4, 5}));
}

TEST_F(DataFiles, EveryTenthRowIsHeldOutWithoutATestSet) {
  std::string text = "u,v,label\n";
  for (int i = 0; i < 25; ++i) text += std::to_string(i) + ",0.5," + std::to_string(i % 3) + "\n";
  const auto path = write("t.csv", text);
  const FileData d = load_file_data(path);
  EXPECT_EQ(d.train.size(), 23);
  EXPECT_EQ(d.test.size(), 2);
  EXPECT_EQ(d.test_source, "every 10th row held out");
  EXPECT_EQ(d.train.num_classes, 3);
  EXPECT_EQ(d.test.inputs.to_vector<float>(), (std::vector<float>{9, 0.5f, 19, 0.5f}));
  EXPECT_EQ(d.test.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  // Columns chosen by name: targets u and v (values), input label.
  const FileData r =
      load_file_data(path, {.input_columns = {"label"}, .target_columns = {"u", "v"}});
  EXPECT_EQ(r.train.num_classes, 0);
  EXPECT_EQ(r.train.inputs.shape(), (Shape{23, 1}));
  EXPECT_EQ(r.train.labels.shape(), (Shape{23, 2}));
  EXPECT_NE(error_text([&] {
              load_file_data(path, {.target_columns = {"w"}});
            }).find("no column 'w'; its columns are u, v, label"),
            std::string::npos);
  // A test file of the same form replaces the held-out rows.
  const auto test = write("test.csv", "u,v,label\n1,2,1\n");
  const FileData t = load_file_data(path, {.test_path = test});
  EXPECT_EQ(t.train.size(), 25);
  EXPECT_EQ(t.test.size(), 1);
}

TEST_F(DataFiles, ADirectoryOfNpyFilesAndAnNpzAreTheSameData) {
  const Bytes x = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1), }",
                            le_bytes<float>({1, 2}));
  const Bytes y =
      npy_bytes("{'descr': '|u1', 'fortran_order': False, 'shape': (2,), }", Bytes{1, 0});
  fs::create_directories(dir_ / "arrays");
  write("arrays/x.npy", x);
  write("arrays/y.npy", y);
  write("arrays/x_test.npy", x);
  write("arrays/y_test.npy", y);
  const auto npz = write(
      "d.npz", zip_bytes({{"x.npy", x}, {"y.npy", y}, {"x_test.npy", x}, {"y_test.npy", y}}, true));
  EXPECT_TRUE(is_file_data((dir_ / "arrays").string()));
  EXPECT_FALSE(is_file_data(dir_.string()));
  for (const auto& path : {(dir_ / "arrays").string(), npz}) {
    const FileData d = load_file_data(path);
    EXPECT_EQ(d.test_source, "x_test/y_test");
    EXPECT_EQ(d.train.num_classes, 2);
    EXPECT_EQ(d.train.labels.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
    EXPECT_EQ(d.test.inputs.to_vector<float>(), (std::vector<float>{1, 2}));
  }
  const auto only_x = write("x.npz", zip_bytes({{"x.npy", x}}, false));
  EXPECT_NE(error_text([&] { load_file_data(only_x); }).find("no array 'y'; it holds x"),
            std::string::npos);
  const auto single = write("one.npy", x);
  EXPECT_NE(error_text([&] { load_file_data(single); }).find("one .npy holds one array"),
            std::string::npos);
}

TEST_F(DataFiles, CsvHeadersAsPandasAndExcelWriteThem) {
  // pandas names a bare array's columns 0, 1, ...; a first line of numbers only is data.
  const CsvTable numbered = parse_csv("0,1,label\n5,6,1\n", "t.csv");
  EXPECT_EQ(numbered.columns, (std::vector<std::string>{"0", "1", "label"}));
  EXPECT_NE(error_text([&] {
              parse_csv("0,1,2\n5,6,1\n", "t.csv");
            }).find("t.csv:1: the first line holds only numbers (0,1,2)"),
            std::string::npos);
  // Excel's "CSV UTF-8" starts with a byte-order mark, which is not part of the name.
  const CsvTable bom = parse_csv("\xEF\xBB\xBFlabel,a\n1,2\n", "t.csv");
  EXPECT_EQ(bom.columns, (std::vector<std::string>{"label", "a"}));
  EXPECT_EQ(bom.lines, (std::vector<int64_t>{2}));
  EXPECT_NE(error_text([&] { parse_csv(",a,y\n0,1,2\n", "t.csv"); }).find("index=False"),
            std::string::npos);
  // Not strtod's hexadecimal, nor numbers past double's range or, for f32, float's.
  EXPECT_NE(error_text([&] {
              parse_csv("a,y\n0x10,1\n", "t.csv");
            }).find("t.csv:2: column 'a' holds '0x10'"),
            std::string::npos);
  EXPECT_NE(error_text([&] {
              parse_csv("a,y\n1e400,1\n", "t.csv");
            }).find("t.csv:2: column 'a' holds '1e400'"),
            std::string::npos);
  const CsvTable big = parse_csv("a,y\n1,1\n\n1e300,1\n", "t.csv");
  EXPECT_EQ(big.lines, (std::vector<int64_t>{2, 4}));
  EXPECT_NE(error_text([&] {
              big.take({"a"}, DType::f32, "t.csv");
            }).find("t.csv:4: column 'a' holds 1e+300, past float32's range"),
            std::string::npos);
}

TEST_F(DataFiles, ATestCsvIsReadByTheTrainingColumnNames) {
  const auto train = write("train.csv", "a,b,label\n1,2,0\n3,4,1\n5,6,2\n");
  // The same rows with the columns in another order.
  const auto test = write("test.csv", "label,b,a\n0,2,1\n1,4,3\n2,6,5\n");
  const FileData d = load_file_data(train, {.test_path = test});
  EXPECT_EQ(d.test.inputs.to_vector<float>(), d.train.inputs.to_vector<float>());
  EXPECT_EQ(d.test.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2}));
  const FileData chosen =
      load_file_data(train, {.input_columns = {"b"}, .target_columns = {"a"}, .test_path = test});
  EXPECT_EQ(chosen.test.inputs.to_vector<float>(), (std::vector<float>{2, 4, 6}));
  const auto other = write("other.csv", "p,q,r\n1,2,0\n");
  EXPECT_NE(error_text([&] { load_file_data(train, {.test_path = other}); })
                .find("other.csv: no column 'a', which the training file has as an input; its "
                      "columns are p, q, r"),
            std::string::npos);
  EXPECT_NE(error_text([&] {
              load_file_data(train, {.target_columns = {"label", "label"}});
            }).find("--target-columns names column 'label' twice"),
            std::string::npos);
}

TEST_F(DataFiles, TheTrainingTargetsDecideTheTestSetsKind) {
  const auto train = write("train.csv", "a,label\n1,0\n2,1\n3,2\n");
  // One test target that is not a class id: an error naming its line, not a regression.
  const auto negative = write("neg.csv", "a,label\n1,0\n\n2,-1\n");
  const std::string e = error_text([&] { load_file_data(train, {.test_path = negative}); });
  EXPECT_NE(e.find("neg.csv: target -1 at line 4 is not a class id (an integer >= 0), while the "
                   "training targets are class ids 0..2"),
            std::string::npos)
      << e;
  const auto fraction = write("frac.csv", "a,label\n1,0.5\n");
  EXPECT_NE(error_text([&] {
              load_file_data(train, {.test_path = fraction});
            }).find("frac.csv: target 0.5 at line 2 is not a class id"),
            std::string::npos);
  // Training targets that are values make the test set's values too, whatever they look like.
  const auto values = write("values.csv", "a,label\n1,0.5\n2,1\n");
  const FileData r = load_file_data(values, {.test_path = train});
  EXPECT_EQ(r.train.num_classes, 0);
  EXPECT_EQ(r.test.num_classes, 0);
  EXPECT_EQ(r.test.labels.to_vector<float>(), (std::vector<float>{0, 1, 2}));
  // x_test/y_test arrays name their index.
  const Bytes x = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                            le_bytes<float>({1, 2}));
  const Bytes y = npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                            le_bytes<int64_t>({0, 1}));
  const Bytes y_test = npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                                 le_bytes<int64_t>({1, -3}));
  const auto npz = write(
      "d.npz",
      zip_bytes({{"x.npy", x}, {"y.npy", y}, {"x_test.npy", x}, {"y_test.npy", y_test}}, false));
  EXPECT_NE(
      error_text([&] { load_file_data(npz); }).find("target -3 at y_test[1] is not a class id"),
      std::string::npos);
}

TEST_F(DataFiles, ErrorsNameTheRowAsTheFileNumbersIt) {
  // 30 rows; row 25 (line 27 of the CSV) is 0.5, which the held-out split moves to
  // the 23rd training row: the message must still say where it is in the file.
  std::string text = "a,label\n";
  std::vector<float> ys;
  for (int i = 0; i < 30; ++i) {
    ys.push_back(i == 25 ? 0.5f : static_cast<float>(i % 2));
    text += fmt::format("{},{}\n", i, ys.back());
  }
  const auto csv = write("t.csv", text);
  EXPECT_NE(error_text([&] {
              load_file_data(csv, {.kind = TargetKind::classify});
            }).find("t.csv/train: target 0.5 at line 27 is not a class id"),
            std::string::npos);
  // x (ones) and y as an .npz of 30 f32 rows.
  const auto xy_npz = [&](const std::string& name) {
    const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (30,), }";
    return write(
        name, zip_bytes({{"x.npy", npy_bytes(dict, le_bytes<float>(std::vector<float>(30, 1.0f)))},
                         {"y.npy", npy_bytes(dict, le_bytes<float>(ys))}},
                        false));
  };
  const auto npz = xy_npz("t.npz");
  EXPECT_NE(error_text([&] {
              load_file_data(npz, {.kind = TargetKind::classify});
            }).find("t.npz/train: target 0.5 at y[25] is not a class id"),
            std::string::npos);
  // A held-out row keeps its name too: row 29 is the third test row.
  ys[25] = 1;
  ys[29] = -2;
  const auto held = xy_npz("h.npz");
  EXPECT_NE(error_text([&] {
              load_file_data(held, {.kind = TargetKind::classify});
            }).find("h.npz/test: target -2 at y[29] is not a class id"),
            std::string::npos);
}

TEST_F(DataFiles, AClassIdPastTheBoundIsNamedNotAllocated) {
  const auto path = write("big.csv", "a,label\n1,0\n2,1000000000\n");
  const auto test = write("small.csv", "a,label\n1,0\n");
  const std::string e = error_text([&] { load_file_data(path, {.test_path = test}); });
  EXPECT_NE(e.find("big.csv/train: target 1000000000 at line 3 would make 1000000001 classes"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("--task regress"), std::string::npos) << e;
  EXPECT_EQ(
      load_file_data(path, {.kind = TargetKind::regress, .test_path = test}).train.num_classes, 0);
  // The largest id allowed is 2^20 - 1.
  const auto edge = write("edge.csv", "a,label\n1,0\n2,1048575\n");
  EXPECT_EQ(load_file_data(edge, {.test_path = test}).train.num_classes, 1048576);
}

// Audit, 2026-12-01: each ran with exit 0 before (a model widened by the test set,
// a test accuracy over NaN inputs, an inf from a float64, the training file as its
// own test set).
TEST_F(DataFiles, BadValuesAndSetsThatMixAreNamedNotTrainedOn) {
  const auto train = write("train.csv", "a,label\n1,0\n2,1\n");
  // A test class no training row has: the model could never predict it.
  const auto shifted = write("shifted.csv", "a,label\n1,1\n2,2\n");
  std::string e = error_text([&] { load_file_data(train, {.test_path = shifted}); });
  EXPECT_NE(e.find("shifted.csv: target 2 at line 3 is a class no training row has (the training "
                   "targets are class ids 0..1)"),
            std::string::npos)
      << e;
  // Rows held out of one file may hold a class the others lack: the model gets it.
  std::string held = "a,label\n";
  for (int i = 0; i < 10; ++i) held += fmt::format("{},{}\n", i, i == 9 ? 2 : i % 2);
  EXPECT_EQ(load_file_data(write("held.csv", held)).train.num_classes, 3);
  // NaN and inf: in a CSV, and in an .npz's test inputs.
  const auto nan_csv = write("nan.csv", "a,b,label\n1,2,0\n3,nan,1\n");
  const auto ab_test = write("ab.csv", "a,b,label\n1,2,0\n");
  e = error_text([&] { load_file_data(nan_csv, {.test_path = ab_test}); });
  EXPECT_NE(e.find("nan.csv/train: input nan at line 3, element 1: not a finite number; drop or "
                   "impute missing values (NaN), or clip infinities, first"),
            std::string::npos)
      << e;
  const Bytes x = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                            le_bytes<float>({1, 2}));
  const Bytes x_inf = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                                le_bytes<float>({1, std::numeric_limits<float>::infinity()}));
  const Bytes y = npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (2,), }",
                            le_bytes<int64_t>({0, 1}));
  const auto inf_npz = write(
      "inf.npz",
      zip_bytes({{"x.npy", x}, {"y.npy", y}, {"x_test.npy", x_inf}, {"y_test.npy", y}}, false));
  e = error_text([&] { load_file_data(inf_npz); });
  EXPECT_NE(e.find("input inf at x_test[1]: not a finite number"), std::string::npos) << e;
  // Regression targets too.
  const auto reg = write("reg.csv", "a,v\n1,0.5\n2,nan\n");
  e = error_text([&] { load_file_data(reg, {.test_path = reg}); });
  EXPECT_NE(e.find("is the training data"), std::string::npos) << e;
  const auto reg_test = write("reg_test.csv", "a,v\n1,0.5\n");
  e = error_text([&] { load_file_data(reg, {.test_path = reg_test}); });
  EXPECT_NE(e.find("reg.csv/train: target nan at line 3: not a finite number"), std::string::npos)
      << e;
  // A float64 past float32's range is named, not read as inf.
  const Bytes big = npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                              le_bytes<double>({1.0, 1e40}));
  const auto f8 = write("f8.npz", zip_bytes({{"x.npy", big}, {"y.npy", y}}, false));
  e = error_text([&] { load_file_data(f8); });
  EXPECT_NE(e.find("element 1 is 1e+40, past float32's range"), std::string::npos) << e;
  // An array named like the test set's but not it: named, not left out.
  const auto typo =
      write("typo.npz",
            zip_bytes({{"x.npy", x}, {"y.npy", y}, {"x_tset.npy", x}, {"names.npy", y}}, false));
  e = error_text([&] { load_file_data(typo); });
  EXPECT_NE(e.find("array 'x_tset' is none of the arrays this reads"), std::string::npos) << e;
  const auto extra =
      write("extra.npz", zip_bytes({{"x.npy", x}, {"y.npy", y}, {"x_mean.npy", y}}, false));
  EXPECT_THROW(load_file_data(extra), ValueError);  // 2 rows: too few to hold 1 in 10 out
  e = error_text([&] { load_file_data(extra); });
  EXPECT_EQ(e.find("none of the arrays"), std::string::npos) << e;
  // --test-data naming the training file itself.
  e = error_text(
      [&] { load_file_data(train, {.test_path = (dir_ / "." / "train.csv").string()}); });
  EXPECT_NE(e.find("is the training data " + train + " itself"), std::string::npos) << e;
}

TEST_F(DataFiles, ExtensionsInAnyCaseAndNpyNamesThatDoNotFit) {
  const auto upper = write("UP.CSV", "a,label\n1,0\n2,1\n");
  EXPECT_TRUE(is_file_data(upper));
  const auto upper_test = write("TEST.CSV", "a,label\n3,1\n");
  EXPECT_EQ(load_file_data(upper, {.test_path = upper_test}).train.size(), 2);
  fs::create_directories(dir_ / "caps");
  write("caps/X.npy", npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                                le_bytes<float>({1})));
  EXPECT_TRUE(is_file_data((dir_ / "caps").string()));
  EXPECT_NE(error_text([&] {
              load_file_data((dir_ / "caps").string());
            }).find("has no x.npy (it holds X.npy)"),
            std::string::npos);
  // Single values are not arrays of rows.
  const Bytes scalar =
      npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", le_bytes<float>({3}));
  const auto zero_d = write("s.npz", zip_bytes({{"x.npy", scalar}, {"y.npy", scalar}}, false));
  EXPECT_NE(
      error_text([&] { load_file_data(zero_d); }).find("s.npz: x is a single value (shape [])"),
      std::string::npos);
}

}  // namespace
}  // namespace ddp
