#include "models/gpt_config.h"

#include "runtime/error.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace ddp::models {
namespace {

// The message of the ValueError that gpt_config(spec) throws ("" when none).
std::string error_of(const std::string& spec) {
  try {
    gpt_config(spec);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

int64_t sum_of_tensors(const GptConfig& c) {
  int64_t n = 0;
  for (const auto& t : gpt_tensors(c)) n += t.numel();
  return n;
}

TEST(GptConfig, Gpt2HasGpt2sParameterCount) {
  // GPT-2 small with its LM head tied to wte: 124,439,808 (llm.c, HF transformers).
  const GptConfig c = gpt_config("gpt2");
  EXPECT_EQ(parameter_count(c), 124'439'808);
  EXPECT_EQ(sum_of_tensors(c), 124'439'808);
  EXPECT_EQ(c.head_dim(), 64);
}

TEST(GptConfig, ClosedFormCountEqualsTheTensorList) {
  for (const char* name : {"gpt-tiny", "gpt-mini", "gpt:layers=3,d=48,heads=6,ctx=17,vocab=91"}) {
    const GptConfig c = gpt_config(name);
    EXPECT_EQ(parameter_count(c), sum_of_tensors(c)) << name;
  }
  EXPECT_EQ(parameter_count(gpt_config("gpt-tiny")), 120'576);
  EXPECT_EQ(parameter_count(gpt_config("gpt-mini")), 10'844'160);
}

TEST(GptConfig, TensorNamesAreGpt2sWithLinearLayout) {
  const auto tensors = gpt_tensors(gpt_config("gpt:layers=2,d=8,heads=2,ctx=5,vocab=11"));
  ASSERT_EQ(tensors.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(tensors.front().name, "transformer.wte.weight");
  EXPECT_EQ(tensors.front().shape, (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(tensors[1].name, "transformer.wpe.weight");
  EXPECT_EQ(tensors[1].shape, (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(tensors[4].name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(tensors[4].shape, (std::vector<int64_t>{24, 8}));  // [out, in]
  EXPECT_EQ(tensors[12].name, "transformer.h.0.mlp.c_proj.weight");
  EXPECT_EQ(tensors[12].shape, (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(tensors[14].name, "transformer.h.1.ln_1.weight");
  EXPECT_EQ(tensors.back().name, "transformer.ln_f.bias");
  std::set<std::string> names;
  for (const auto& t : tensors) names.insert(t.name);
  EXPECT_EQ(names.size(), tensors.size()) << "a name appears twice";
  EXPECT_FALSE(names.contains("lm_head.weight")) << "the head is tied to wte";
}

TEST(GptConfig, SpecParsesAndDescribesBack) {
  const GptConfig c = gpt_config("gpt:layers=4,d=128,heads=4,ctx=128");
  EXPECT_EQ(c.layers, 4);
  EXPECT_EQ(c.d_model, 128);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.context, 128);
  EXPECT_EQ(c.vocab, 256);
  EXPECT_EQ(c.dropout, 0.0);
  EXPECT_EQ(describe(c), "gpt:layers=4,d=128,heads=4,ctx=128,vocab=256");
  const GptConfig back = gpt_config(describe(gpt_config("gpt2")));
  EXPECT_EQ(parameter_count(back), 124'439'808);
  EXPECT_EQ(gpt_config("gpt:ctx=8,heads=2,d=4,layers=1,dropout=0.25,vocab=7").dropout, 0.25);
  // Note [padded head]: the logits' width, not the parameters.
  const GptConfig padded = gpt_config("gpt:layers=1,d=8,heads=2,ctx=4,vocab=11,padded_vocab=16");
  EXPECT_EQ(padded.padded_vocab, 16);
  EXPECT_EQ(padded.logits_width(), 16);
  EXPECT_EQ(c.logits_width(), 256);
  EXPECT_EQ(describe(padded), "gpt:layers=1,d=8,heads=2,ctx=4,vocab=11,padded_vocab=16");
  EXPECT_EQ(gpt_config(describe(padded)).padded_vocab, 16);
  EXPECT_EQ(parameter_count(padded),
            parameter_count(gpt_config("gpt:layers=1,d=8,heads=2,ctx=4,vocab=11")));
  EXPECT_TRUE(is_gpt_model("gpt-mini"));
  EXPECT_TRUE(is_gpt_model("gpt:layers=1"));
  EXPECT_FALSE(is_gpt_model("mlp"));
}

// A checkpoint resumes across padded_vocab (Note [padded head]), not across anything
// that changes the parameters or the loss.
TEST(GptConfig, SameModelLeavesOutOnlyThePadding) {
  const std::string base = "gpt:layers=2,d=64,heads=4,ctx=64,vocab=50257";
  const GptConfig plain = gpt_config(base);
  EXPECT_TRUE(same_model(plain, gpt_config(base + ",padded_vocab=50304")));
  EXPECT_TRUE(same_model(gpt_config(base + ",padded_vocab=50304"), plain));
  EXPECT_TRUE(same_model(gpt_config("gpt2"), gpt_config(describe(gpt_config("gpt2")))));
  for (const std::string& other :
       {std::string("gpt:layers=3,d=64,heads=4,ctx=64,vocab=50257"),
        std::string("gpt:layers=2,d=128,heads=4,ctx=64,vocab=50257"),
        std::string("gpt:layers=2,d=64,heads=8,ctx=64,vocab=50257"),
        std::string("gpt:layers=2,d=64,heads=4,ctx=32,vocab=50257"),
        std::string("gpt:layers=2,d=64,heads=4,ctx=64,vocab=50304"), base + ",dropout=0.1"}) {
    EXPECT_FALSE(same_model(plain, gpt_config(other))) << other;
    EXPECT_FALSE(same_model(gpt_config(other), plain)) << other;
  }
}

TEST(GptConfig, BadSpecsNameTheValueAndTheFix) {
  const std::string base = "gpt:layers=2,d=64,heads=4,ctx=64";
  EXPECT_NE(error_of("gpt-huge").find("valid gpt models are gpt-tiny, gpt-mini, gpt2"),
            std::string::npos)
      << error_of("gpt-huge");
  EXPECT_NE(error_of(base + ",depth=3").find("unknown key 'depth'; valid keys are layers, d"),
            std::string::npos);
  EXPECT_NE(error_of("gpt:layers=2,d=65,heads=4,ctx=64")
                .find("d=65 is not divisible by heads=4 (each head gets d/heads dimensions); "
                      "pick d a multiple of 4, like d=68"),
            std::string::npos)
      << error_of("gpt:layers=2,d=65,heads=4,ctx=64");
  EXPECT_NE(
      error_of("gpt:layers=0,d=64,heads=4,ctx=64").find("layers=0 is not a positive whole number"),
      std::string::npos);
  EXPECT_NE(error_of("gpt:layers=2,d=64,heads=-4,ctx=64").find("heads=-4 is not a positive"),
            std::string::npos);
  EXPECT_NE(error_of("gpt:layers=2,d=64,heads=4").find("ctx= is missing"), std::string::npos);
  EXPECT_NE(error_of(base + ",d=32").find("d is given twice"), std::string::npos);
  EXPECT_NE(error_of(base + ",vocab").find("'vocab' is not key=value"), std::string::npos);
  EXPECT_NE(error_of(base + ",dropout=1.5").find("dropout=1.5 is not a probability in [0, 1)"),
            std::string::npos);
  EXPECT_NE(error_of(base + ",vocab=50257,padded_vocab=50000")
                .find("padded_vocab=50000 is smaller than vocab=50257; the LM head's logits are "
                      "padded up to it (Note [padded head]): give a value >= 50257, like 50304"),
            std::string::npos)
      << error_of(base + ",vocab=50257,padded_vocab=50000");
  EXPECT_NE(error_of(base + ",vocab=50257,padded_vocab=50260")
                .find("padded_vocab=50260 is not a multiple of 8; the padding is for rows of bf16 "
                      "logits that are 16-byte aligned (Note [padded head]): give a multiple of "
                      "64, like 50304"),
            std::string::npos)
      << error_of(base + ",vocab=50257,padded_vocab=50260");
  EXPECT_NE(
      error_of(base + ",padded_vocab=0").find("padded_vocab=0 is not a positive whole number"),
      std::string::npos);
  EXPECT_NE(error_of("gpt:layers=2,d=64,heads=4,ctx=6x4")
                .find("--model 'gpt:layers=2,d=64,heads=4,"
                      "ctx=6x4': ctx=6x4 is not a positive"),
            std::string::npos);
}

TEST(GptConfig, ValidateRejectsAHandMadeConfig) {
  GptConfig c = gpt_config("gpt-tiny");
  c.heads = 0;
  EXPECT_THROW(validate(c), ValueError);
  c = gpt_config("gpt-tiny");
  c.vocab = -1;
  EXPECT_THROW(validate(c), ValueError);
}

}  // namespace
}  // namespace ddp::models
