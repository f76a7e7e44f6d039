// A LoRA checkpoint that refers to its frozen base model instead of copying it (save_base_model false;
// docs/lora.md): the checkpoint holds config.json, the adapter (PEFT's files, whose adapter_config.json names
// the base in base_model_name_or_path, as PEFT saves it), the optimizer and trainer state, and
// base_model.json: the base directory's absolute path and a fingerprint of its weight files (their names,
// sizes and safetensors headers). Every reader of the checkpoint (resume, generate, logits, convert,
// init_from) reads the base from there, and refuses a base that is missing or whose files differ from the
// fingerprint: a different model, or one rewritten in another dtype or shape, is caught; values edited in
// place, keeping the headers, are not.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace anvil::io {

inline constexpr const char* kBaseReferenceFile = "base_model.json";

struct BaseReference {
  std::string dir;  // absolute
  struct File {
    std::string name;
    uint64_t bytes = 0;
    uint64_t header_hash = 0;  // FNV-1a of the safetensors header (its length and JSON)
    bool operator==(const File&) const = default;
  };
  std::vector<File> files;  // the weight files, by name
};

// The fingerprint of model directory `dir`'s weight files (model.safetensors, or the shards of
// model.safetensors.index.json, and the index). Throws, naming the directory, where there are none.
BaseReference describe_base(const std::string& dir);
// Writes `ref` as base_model.json into `checkpoint_dir` (synced).
void write_base_reference(const std::string& checkpoint_dir, const BaseReference& ref);
// Whether `dir` refers to its base (holds base_model.json).
bool refers_to_base(const std::string& dir);
// The base directory `dir` refers to, checked against its fingerprint; nullopt where `dir` holds no
// reference. A missing base, or one whose files differ, is an error naming both directories and what to do.
std::optional<std::string> referenced_base(const std::string& dir);

}  // namespace anvil::io
