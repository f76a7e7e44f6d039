// Freezing parameters (freeze_parameters): glob patterns over the layout's Hugging Face tensor names mark
// tensors not trainable (ParamLayout::set_trainable). What a frozen tensor means for a training step is
// stated at ParamLayout::set_trainable; this file only resolves the patterns, with errors that name them.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "model/param_layout.hpp"

namespace anvil {

// fnmatch-style matching of a whole name: `*` any run of characters (dots included), `?` one character,
// `[abc]`, `[0-7]`, `[!0-7]` one character of (not of) a set. No escapes.
bool glob_match(std::string_view pattern, std::string_view name);

// Splits "a, b,c" at commas, trimming blanks; empty pieces are dropped.
std::vector<std::string> split_patterns(const std::string& list);

struct FrozenCount {
  size_t tensors = 0;
  size_t numel = 0;
};

// What `layout` has frozen.
FrozenCount count_frozen(const ParamLayout& layout);

// Marks every tensor whose name or alias matches one of `patterns` frozen; returns how many tensors and
// elements are frozen. Errors (naming `what`, the key the patterns came from): a pattern that matches no
// tensor (with the first tensor names, so the user sees the naming), or patterns that freeze every tensor.
FrozenCount freeze_parameters(ParamLayout& layout, const std::vector<std::string>& patterns,
                              const std::string& what = "freeze_parameters");

}  // namespace anvil
