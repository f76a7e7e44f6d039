// LoRA checkpoints that refer to their base (save_base_model false; io/base_reference.hpp): a run from a base
// directory writes the adapter, base_model.json and config.json, not the base; the run, its resume, and what
// `convert` and `logits` make of its checkpoints equal those of the run that copies the base
// (save_base_model true); ZeRO-3 on two ranks and QLoRA (nf4-dq, whose codes re-quantize from the base)
// resume from them exactly; a base that changed or went is refused, naming it and what to do.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/trainer.hpp"
#include "dist/communicator.hpp"
#include "io/base_reference.hpp"
#include "io/safetensors.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

json run_json(const test::ByteCorpus& c, const std::string& name, const json& extra) {
  json j = {{"model_name_or_path", c.dir / "base"},
            {"train_data", c.dir / "data/train.bin"},
            {"per_device_train_batch_size", 2},
            {"max_seq_length", 32},
            {"max_steps", 6},
            {"save_steps", 3},
            {"learning_rate", 1e-2},
            {"logging_steps", 1},
            {"device", "cpu"},
            {"seed", 5},
            {"dataloader_pin_memory", false},
            {"lora_r", 4},
            {"lora_target_modules", "all-linear"},
            {"output_dir", c.dir / name}};
  j.update(extra);
  return j;
}

TrainConfig run_config(const test::ByteCorpus& c, const std::string& name,
                       const json& extra = json::object()) {
  return TrainConfig::from_json(run_json(c, name, extra), "test");
}

// c.dir/base: a llama-tiny model directory (model.safetensors, config.json), not a checkpoint.
void make_base(const test::ByteCorpus& c) {
  const json j = {{"model", "llama-tiny"},
                  {"train_data", c.dir / "data/train.bin"},
                  {"per_device_train_batch_size", 2},
                  {"max_seq_length", 32},
                  {"max_steps", 1},
                  {"device", "cpu"},
                  {"dataloader_pin_memory", false},
                  {"output_dir", c.dir / "pretrain"}};
  test::quietly([&] { return train(TrainConfig::from_json(j, "test")); });
  fs::create_directories(c.dir / "base");
  for (const char* f : {"model.safetensors", "config.json"})
    fs::copy_file(c.dir / ("pretrain/checkpoint-1/" + std::string(f)), c.dir / ("base/" + std::string(f)));
}

size_t dir_bytes(const fs::path& d) {
  size_t n = 0;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(d))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

void expect_refers_to_base(const test::ByteCorpus& c, const fs::path& ckpt) {
  EXPECT_FALSE(fs::exists(ckpt / "model.safetensors")) << ckpt;
  EXPECT_FALSE(fs::exists(ckpt / "quantized_base.safetensors")) << ckpt;
  for (const char* f : {"config.json", "adapter_model.safetensors", "adapter_config.json", "base_model.json"})
    EXPECT_TRUE(fs::exists(ckpt / f)) << ckpt << " lacks " << f;
  const json adapter = json::parse(test::read_file(ckpt / "adapter_config.json"));
  EXPECT_EQ(adapter.value("base_model_name_or_path", ""),
            fs::absolute(c.dir / "base").lexically_normal().string());
  EXPECT_EQ(io::referenced_base(ckpt.string()), fs::absolute(c.dir / "base").lexically_normal().string());
}

TEST(LoraBaseReference, CheckpointsReferToTheBaseAndReadAsTheCopy) {
  test::ByteCorpus c;
  make_base(c);
  testing::internal::CaptureStdout();
  train(run_config(c, "ref"));
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("(the adapter; its base: "), std::string::npos) << out;
  test::quietly([&] { return train(run_config(c, "copy", {{"save_base_model", true}})); });
  for (const char* step : {"checkpoint-3", "checkpoint-6"})
    expect_refers_to_base(c, c.dir / ("ref/" + std::string(step)));
  EXPECT_TRUE(fs::exists(c.dir / "copy/checkpoint-6/model.safetensors"));
  EXPECT_FALSE(fs::exists(c.dir / "copy/checkpoint-6/base_model.json"));
  EXPECT_LT(4 * dir_bytes(c.dir / "ref/checkpoint-6"), dir_bytes(c.dir / "copy/checkpoint-6"));
  const std::vector<double> ref = test::metrics_losses(c.dir / "ref/metrics.jsonl");
  ASSERT_EQ(ref.size(), 6u);
  EXPECT_EQ(ref, test::metrics_losses(c.dir / "copy/metrics.jsonl"));
  EXPECT_EQ(test::read_file(c.dir / "ref/checkpoint-6/adapter_model.safetensors"),
            test::read_file(c.dir / "copy/checkpoint-6/adapter_model.safetensors"));

  // Resumed from the referring checkpoint: steps 4-6 again, and its checkpoints refer to the same base.
  test::quietly([&] {
    return train(run_config(c, "resumed", {{"resume_from_checkpoint", c.dir / "ref/checkpoint-3"}}));
  });
  const std::vector<double> r = test::metrics_losses(c.dir / "resumed/metrics.jsonl");
  ASSERT_EQ(r.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r[i], ref[3 + i]) << "step " << 4 + i;
  expect_refers_to_base(c, c.dir / "resumed/checkpoint-6");

  // convert merges the adapter into the referred base as into the copy; logits read it the same way.
  for (const char* run : {"ref", "copy"}) {
    const test::CommandResult m =
        test::run_anvil("convert --input " + c.dir / (std::string(run) + "/checkpoint-6") + " --output " +
                        c.dir / (std::string("merged_") + run));
    ASSERT_EQ(m.exit_code, 0) << m.output;
  }
  EXPECT_EQ(test::read_file(c.dir / "merged_ref/model.safetensors"),
            test::read_file(c.dir / "merged_copy/model.safetensors"));
  const std::string ids = c.dir / "ids.safetensors";
  {
    io::SafeTensorsWriter w;
    const std::vector<int32_t> v = {72, 101, 108, 108, 111, 32, 119, 111};
    w.add("input_ids", DType::I32, {1, 8}, v.data());
    w.write(ids);
  }
  const auto logits_of = [&](const std::string& ckpt, const std::string& name) {
    const test::CommandResult l =
        test::run_anvil("logits --input_ids " + ids + " --output " + c.dir / name + " --checkpoint " + ckpt);
    EXPECT_EQ(l.exit_code, 0) << l.output;
    return test::read_file(c.dir / name);
  };
  EXPECT_EQ(logits_of(c.dir / "ref/checkpoint-6", "a.st"), logits_of(c.dir / "copy/checkpoint-6", "b.st"));
}

TEST(LoraBaseReference, AChangedOrMissingBaseIsRefused) {
  test::ByteCorpus c;
  make_base(c);
  test::quietly([&] { return train(run_config(c, "ref", {{"max_steps", 3}})); });
  const std::string ckpt = c.dir / "ref/checkpoint-3";
  // zero-to-fp32 has no model file to convert: it says what does.
  const test::CommandResult z = test::run_anvil("zero-to-fp32 " + ckpt + " " + c.dir / "fp32");
  EXPECT_NE(z.exit_code, 0);
  EXPECT_NE(z.output.find("refers to its base model (base_model.json)"), std::string::npos) << z.output;
  EXPECT_NE(z.output.find("anvil convert --input " + ckpt), std::string::npos) << z.output;
  // The base rewritten in bf16 (another model as far as its files tell): refused, naming what to do.
  const test::CommandResult bf16 =
      test::run_anvil("convert --input " + c.dir / "base" + " --output " + c.dir / "base_bf16 --dtype bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  fs::rename(c.dir / "base", c.dir / "base_fp32");
  fs::rename(c.dir / "base_bf16", c.dir / "base");
  const json resumed = {{"resume_from_checkpoint", ckpt}, {"max_steps", 6}};
  test::expect_error(
      [&] { test::quietly([&] { return train(run_config(c, "again", resumed)); }); },
      {"base_model.json", "is not the one this checkpoint's adapter was trained on", "--adapter"});
  // Gone: refused the same way; the adapter still reads with the base given beside it.
  fs::remove_all(c.dir / "base");
  test::expect_error([&] { test::quietly([&] { return train(run_config(c, "again", resumed)); }); },
                     {"base_model.json", "is gone", "--adapter " + ckpt});
  const test::CommandResult m = test::run_anvil("convert --input " + c.dir / "base_fp32" + " --adapter " +
                                                ckpt + " --output " + c.dir / "merged");
  EXPECT_EQ(m.exit_code, 0) << m.output;
}

// QLoRA nf4-dq: without quantized_base.safetensors the base re-quantizes from its directory to the codes the
// run started with, so the resume is exact.
TEST(LoraBaseReference, QLoraDoubleQuantizedResumesExactly) {
  test::ByteCorpus c;
  make_base(c);
  const json q = {{"quantization", "nf4-dq"}};
  test::quietly([&] { return train(run_config(c, "q", q)); });
  expect_refers_to_base(c, c.dir / "q/checkpoint-3");
  json resumed = q;
  resumed["resume_from_checkpoint"] = c.dir / "q/checkpoint-3";
  test::quietly([&] { return train(run_config(c, "qr", resumed)); });
  const std::vector<double> a = test::metrics_losses(c.dir / "q/metrics.jsonl"),
                            b = test::metrics_losses(c.dir / "qr/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b[i], a[3 + i]) << "step " << 4 + i;
}

// ZeRO-3 on two ranks: rank 0 writes the adapter gathered from the shards (the base is not gathered), and
// the run resumes from it exactly.
TEST(LoraBaseReference, ZeroThreeOnTwoRanksResumesExactly) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  make_base(c);
  const auto launch = [&](const std::string& name, const json& extra) {
    test::write_file(c.dir / (name + ".json"), run_json(c, name, extra).dump());
    return test::launch_anvil(2, c.dir / (name + ".json"));
  };
  const test::CommandResult a = launch("z", {{"zero_stage", 3}});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  expect_refers_to_base(c, c.dir / "z/checkpoint-3");
  const test::CommandResult b =
      launch("zr", {{"zero_stage", 3}, {"resume_from_checkpoint", c.dir / "z/checkpoint-3"}});
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::vector<double> x = test::metrics_losses(c.dir / "z/metrics.jsonl"),
                            y = test::metrics_losses(c.dir / "zr/metrics.jsonl");
  ASSERT_EQ(x.size(), 6u);
  ASSERT_EQ(y.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(y[i], x[3 + i]) << "step " << 4 + i;
  EXPECT_EQ(test::read_file(c.dir / "z/checkpoint-6/adapter_model.safetensors"),
            test::read_file(c.dir / "zr/checkpoint-6/adapter_model.safetensors"));
}

}  // namespace
}  // namespace anvil
