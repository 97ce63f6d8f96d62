#include "runtime/checkpoint/safetensors.h"
#include "runtime/checkpoint/crc32c.h"

#include "runtime/checkpoint/json.h"
#include "runtime/error.h"
#include "runtime/ops/ops.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

namespace ddp {
namespace {

namespace fs = std::filesystem;

class SafetensorsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ddp_safetensors_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string read_bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // A file with `header` (unpadded) and `data_bytes` zero bytes of data.
  std::string write_file(const std::string& name, const std::string& header,
                         size_t data_bytes) const {
    std::string bytes(8, '\0');
    const uint64_t n = header.size();
    std::memcpy(bytes.data(), &n, 8);
    return write_bytes(name, bytes + header + std::string(data_bytes, '\0'));
  }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

std::string load_error(const std::string& p) {
  try {
    load_safetensors(p);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(SafetensorsFiles, RoundTripOfEveryDtypeKeepsOrderAndMetadata) {
  const NamedTensors tensors = {
      {"z.weight", from_vector<float>({1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f}, {2, 3})},
      {"a.bf16", from_vector<BFloat16>({{float_to_bf16(1.0f)}, {float_to_bf16(-0.5f)}}, {2})},
      {"m.f16", from_vector<Half>({{float_to_f16(65504.0f)}, {float_to_f16(0.125f)}}, {1, 2})},
      {"i32", from_vector<int32_t>({-2147483647 - 1, 7, 2147483647}, {3})},
      {"i64", from_vector<int64_t>({int64_t{1} << 62, -1}, {2, 1})},
      {"u8", from_vector<uint8_t>({0, 128, 255}, {3})},
      {"scalar", full({}, 4.0)},
      {"empty", empty({0, 5}, {.dtype = DType::i64})},
      {"caf\xc3\xa9 \"quoted\"\n", ones({1})},
  };
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"epoch", "3"}, {"note", "tab\there \\ \"q\" \xe2\x9c\x93"}};
  save_safetensors(path("all.safetensors"), tensors, metadata);
  const SafetensorsFile f = load_safetensors(path("all.safetensors"));
  EXPECT_EQ(f.metadata, metadata);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    SCOPED_TRACE(name);
    EXPECT_EQ(f.tensors[i].first, name);
    const Tensor& got = f.tensors[i].second;
    EXPECT_EQ(got.dtype(), t.dtype());
    EXPECT_EQ(got.shape(), t.shape());
    EXPECT_TRUE(got.device().is_cpu());
    ASSERT_EQ(got.nbytes(), t.nbytes());
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(got.data_ptr(), t.data_ptr(), t.nbytes()), 0);
    }
  }
  EXPECT_TRUE(f.contains("u8"));
  EXPECT_EQ(f.at("i32").to_vector<int32_t>()[2], 2147483647);
  try {
    f.at("missing");
    ADD_FAILURE();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "no tensor 'missing' in the checkpoint; it has: z.weight, a.bf16"),
              std::string::npos);
  }
}

std::string crc_hex(const std::string& bytes) {
  return fmt::format("{:08x}", crc32c_detail::table_crc32c(bytes.data(), bytes.size(), 0));
}

TEST_F(SafetensorsFiles, ExactBytesOfATinyFile) {
  save_safetensors(path("x.safetensors"), {{"x", from_vector<float>({1.0f, 2.0f}, {2})}});
  const std::string data = std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  const std::string header = R"({"__metadata__":{"crc32c/x":")" + crc_hex(data) +
                             R"("},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_EQ(header.size(), 93u);
  const std::string expected =
      std::string("\x60\0\0\0\0\0\0\0", 8) + header + std::string(3, ' ') + data;
  EXPECT_EQ(read_bytes(path("x.safetensors")), expected);

  save_safetensors(path("m.safetensors"), {{"b", from_vector<uint8_t>({9}, {1})}},
                   {{"format", "pt"}});
  const std::string with_meta =
      R"({"__metadata__":{"crc32c/b":")" + crc_hex("\x09") +
      R"(","format":"pt"},"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  const std::string bytes = read_bytes(path("m.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.substr(8, n), with_meta + std::string(n - with_meta.size(), ' '));
  EXPECT_EQ(bytes.size(), 8 + n + 1);
}

// Note [checkpoint checksums]: one flipped bit in a tensor's bytes, or in a
// recorded checksum, is named; a file without checksums (PyTorch's) loads.
TEST_F(SafetensorsFiles, ChecksumsNameTheCorruptedTensor) {
  const std::string p = path("c.safetensors");
  save_safetensors(
      p, {{"a", from_vector<float>({1, 2, 3}, {3})}, {"b", from_vector<int64_t>({4, 5}, {2})}},
      {{"step", "7"}});
  const SafetensorsFile ok = load_safetensors(p);
  EXPECT_EQ(ok.metadata, (std::map<std::string, std::string>{{"step", "7"}}))
      << "the checksum keys are ddp's, not the caller's";
  const std::string good = read_bytes(p);

  std::string flipped = good;
  flipped[flipped.size() - 3] ^= 0x10;  // inside b's data, the last tensor
  const std::string error = load_error(write_bytes("flipped.safetensors", flipped));
  EXPECT_NE(error.find("tensor 'b' is corrupted: its 16 bytes have CRC-32C"), std::string::npos)
      << error;
  EXPECT_NE(error.find("restore it or resume from an earlier checkpoint"), std::string::npos);

  std::string bad_sum = good;
  const size_t at = bad_sum.find("crc32c/a\":\"") + 11;
  bad_sum[at] = bad_sum[at] == '0' ? '1' : '0';
  EXPECT_NE(load_error(write_bytes("badsum.safetensors", bad_sum)).find("tensor 'a' is corrupted"),
            std::string::npos);

  std::string renamed = good;  // a damaged key must not switch a tensor's check off
  renamed[renamed.find("crc32c/a") + 7] = 'x';
  const std::string stray = load_error(write_bytes("renamed.safetensors", renamed));
  EXPECT_NE(stray.find("has a checksum for 'x', which is not a tensor of the file"),
            std::string::npos)
      << stray;

  const std::string plain = write_file(
      "plain.safetensors", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  EXPECT_EQ(load_safetensors(plain).at("t").numel(), 2);
}

TEST_F(SafetensorsFiles, ChecksumPrefixIsReserved) {
  const std::string error = [&] {
    try {
      save_safetensors(path("r.safetensors"), {{"a", from_vector<float>({1}, {1})}},
                       {{"crc32c/a", "00000000"}});
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  }();
  EXPECT_NE(error.find("reserves for the tensors' checksums"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(path("r.safetensors")));
}

TEST(Crc32c, KnownValuesAndTheFastPathAgreeWithTheTable) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);  // the CRC-32C check value
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), counting(32);
  for (int i = 0; i < 32; ++i) counting[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(counting.data(), 32), 0x46DD794Eu);
  std::vector<uint8_t> data(4099);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t offset : {0, 1, 3, 7}) {
    for (size_t n : {0, 1, 7, 8, 9, 63, 4092}) {
      EXPECT_EQ(crc32c(data.data() + offset, n),
                crc32c_detail::table_crc32c(data.data() + offset, n, 0))
          << offset << " " << n;
    }
  }
  const uint32_t first = crc32c(data.data(), 1000);
  EXPECT_EQ(crc32c(data.data() + 1000, 3099, first), crc32c(data.data(), 4099));
}

TEST_F(SafetensorsFiles, CorruptFilesNameTheProblem) {
  const std::string f32x2 = R"("t":{"dtype":"F32","shape":[2],"data_offsets":)";
  struct Case {
    std::string name, header;
    size_t data_bytes;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"json", R"({"t":{"dtype":"F32",)", 0,
       "the header is not valid JSON: at byte 20: expected a key string, found the end"},
      {"notobject", "[1,2]", 0, "the header must be a JSON object, found an array"},
      {"dtype", R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8,
       "tensor 't' has dtype 'F64', which is unknown or not supported by ddp (supported: F32, "
       "BF16, "
       "F16, I32, I64, U8); ddp has no float64: save it from PyTorch as float32"},
      {"size", "{" + f32x2 + "[0,4]}}", 4,
       "tensor 't': data_offsets [0, 4] do not match its shape: F32 [2] needs 8 bytes"},
      {"range", "{" + f32x2 + "[0,8]}}", 4,
       "tensor 't': data_offsets [0, 8] are out of range: the data section has 4 bytes"},
      {"overlap", "{" + f32x2 + R"([0,8]},"u":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "tensors 't' [0, 8] and 'u' [4, 12] overlap"},
      {"gap", "{" + f32x2 + "[4,12]}}", 12,
       "bytes [0, 4) of the data section belong to no tensor (before 't')"},
      {"trailing", "{" + f32x2 + "[0,8]}}", 10,
       "the data section has 10 bytes, but the tensors use 8 (2 trailing bytes)"},
      {"negative", R"({"t":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0,
       "shape of 't' must be non-negative integers, found an integer -1"},
      {"noshape", R"({"t":{"dtype":"U8","data_offsets":[0,0]}})", 0,
       "tensor 't' has no \"shape\" in the header"},
      {"meta", R"({"__metadata__":{"epoch":3}})", 0,
       "__metadata__ maps strings to strings, but 'epoch' is an integer"},
      {"dup", R"({"t":{},"t":{}})", 0, "at byte 8: duplicate key \"t\""},
  };
  for (const Case& c : cases) {
    const std::string p = write_file(c.name, c.header, c.data_bytes);
    const std::string msg = load_error(p);
    EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.name << ": " << msg;
  }
  const std::string tiny = write_bytes("tiny", "abc");
  EXPECT_EQ(load_error(tiny), tiny +
                                  ": the file has 3 bytes, too short for a safetensors file (it "
                                  "starts with an 8-byte header length)");
  std::string beyond(8, '\0');
  beyond[0] = 100;
  const std::string b = write_bytes("beyond", beyond + "{}");
  EXPECT_EQ(load_error(b), b + ": header length 100 is beyond the end of the file (10 bytes); the "
                               "file is truncated or not a safetensors file");
  EXPECT_NE(
      load_error(path("absent")).find("cannot open the checkpoint: No such file or directory"),
      std::string::npos);
}

TEST_F(SafetensorsFiles, EmptyCheckpointAndSpacesInTheHeader) {
  save_safetensors(path("none.safetensors"), {});
  EXPECT_TRUE(load_safetensors(path("none.safetensors")).tensors.empty());
  const std::string p = write_file(
      "spaced",
      " { \"t\" : { \"dtype\" : \"I32\", \"shape\" : [ ] , \"data_offsets\" : [ 0 , 4 ] } }   ", 4);
  const SafetensorsFile f = load_safetensors(p);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors[0].second.shape(), Shape{});
}

TEST_F(SafetensorsFiles, FailedSaveLeavesTheOldFileAndNoTemporary) {
  const std::string target = path("ckpt.safetensors");
  save_safetensors(target, {{"w", full({4}, 1.0)}});
  const std::string before = read_bytes(target);
  // Invalid input: rejected before anything is written.
  EXPECT_THROW(save_safetensors(target, {{"w", full({4}, 2.0)}, {"w", full({1}, 2.0)}}),
               ValueError);
  EXPECT_THROW(save_safetensors(target, {{"__metadata__", full({1}, 2.0)}}), ValueError);
  EXPECT_THROW(save_safetensors(target, {{"w", Tensor()}}), ValueError);
  // The temporary file cannot be created: a directory is in its way.
  const std::string tmp = target + ".tmp." + std::to_string(::getpid());
  fs::create_directory(tmp);
  try {
    save_safetensors(target, {{"w", full({4}, 3.0)}});
    ADD_FAILURE() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write '" + target + "': creating '" + tmp +
                                         "' failed: Is a directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::is_directory(tmp)) << "a directory ddp did not create must stay";
  fs::remove(tmp);
  EXPECT_EQ(read_bytes(target), before);
  EXPECT_EQ(entries(), (std::vector<std::string>{"ckpt.safetensors"}));
}

TEST_F(SafetensorsFiles, WriteErrorMidwayRemovesTheTemporary) {
  // A file size limit makes the write fail part way (EFBIG) after the temporary exists.
  const std::string target = path("big.safetensors");
  save_safetensors(target, {{"w", full({4}, 1.0)}});
  const std::string before = read_bytes(target);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string msg = "(no error)";
  try {
    save_safetensors(target, {{"w", zeros({1 << 20})}});
  } catch (const ValueError& e) {
    msg = e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(msg.find("cannot write '" + target + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("File too large"), std::string::npos) << msg;
  EXPECT_EQ(read_bytes(target), before);
  EXPECT_EQ(entries(), (std::vector<std::string>{"big.safetensors"}));
}

TEST_F(SafetensorsFiles, SaveIntoAMissingDirectoryNamesThePath) {
  const std::string target = path("no/such/dir/ckpt.safetensors");
  try {
    save_safetensors(target, {{"w", full({4}, 1.0)}});
    ADD_FAILURE() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write '" + target + "'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos);
  }
  EXPECT_TRUE(entries().empty());
}

TEST(Safetensors, StateDictMismatchListsEverything) {
  const std::vector<TensorSpec> expected = {{"0.weight", {128, 784}, DType::f32},
                                            {"0.bias", {128}, DType::f32},
                                            {"2.weight", {10, 128}, DType::f32},
                                            {"2.bias", {10}, DType::f32}};
  const NamedTensors loaded = {{"0.weight", empty({256, 784})},
                               {"0.bias", empty({128}, {.dtype = DType::bf16})},
                               {"3.weight", empty({10, 256})},
                               {"2.weight", empty({10, 128})}};
  try {
    check_state_dict_match(expected, loaded);
    ADD_FAILURE() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_STREQ(
        e.what(),
        "Error(s) in loading state_dict:\n"
        "\tMissing key(s) in state_dict: \"2.bias\".\n"
        "\tUnexpected key(s) in state_dict: \"3.weight\".\n"
        "\tsize mismatch for 0.weight: copying a param with shape [256, 784] from "
        "checkpoint, the shape in current model is [128, 784].\n"
        "\tdtype mismatch for 0.bias: the checkpoint has bf16, the current model has f32.");
  }
  EXPECT_NO_THROW(check_state_dict_match(tensor_specs(loaded), loaded));
  EXPECT_NO_THROW(check_state_dict_match({}, {}));
}

TEST(SafetensorsJson, StringsEscapesAndLimits) {
  const std::string tricky = "a\"b\\c\n\t\x01 caf\xc3\xa9 \xf0\x9f\x98\x80";
  EXPECT_EQ(json::quote(tricky), "\"a\\\"b\\\\c\\n\\t\\u0001 caf\xc3\xa9 \xf0\x9f\x98\x80\"");
  EXPECT_EQ(json::parse(json::quote(tricky)).string, tricky);
  EXPECT_EQ(json::parse(R"("\u00e9\ud83d\ude00\/")").string, "\xc3\xa9\xf0\x9f\x98\x80/");
  const json::Value v = json::parse(R"({"b":[1,-2,9223372036854775807],"a":{}})");
  ASSERT_EQ(v.object.size(), 2u);
  EXPECT_EQ(v.object[0].first, "b");  // text order kept
  EXPECT_EQ(v.object[0].second.array[1].integer, -2);
  EXPECT_EQ(v.object[0].second.array[2].integer, INT64_MAX);
  EXPECT_EQ(json::parse("-9223372036854775808").integer, INT64_MIN);
  for (const char* bad :
       {"9223372036854775808", "1.5", "true", "null", "[1,]", "{\"a\" 1}", "\"\\ud800\"", "\"\\x\"",
        "\"a", "01", "{} x", "\"\xff\"", "\"\xc0\xaf\""}) {
    EXPECT_THROW(json::parse(bad), ValueError) << bad;
  }
  EXPECT_THROW(json::parse(std::string(100, '[') + std::string(100, ']')), ValueError);
  EXPECT_NO_THROW(json::parse(std::string(60, '[') + std::string(60, ']')));
}

TEST(Safetensors, GpuTensorsAreSavedFromTheHost) {
  if (device_count(DeviceType::cuda) == 0) {
    GTEST_SKIP() << "no CUDA device: " << unavailable_reason(DeviceType::cuda);
  }
  const std::string p =
      (fs::temp_directory_path() / ("ddp_gpu_ckpt_" + std::to_string(::getpid()))).string();
  const Tensor w = arange(6, {.device = Device::cuda()}).reshape({2, 3});
  save_safetensors(p, {{"w", w}, {"h", cast(w, DType::bf16)}});
  const SafetensorsFile f = load_safetensors(p);
  fs::remove(p);
  EXPECT_EQ(f.at("w").to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(f.at("h").dtype(), DType::bf16);
}

}  // namespace
}  // namespace ddp
