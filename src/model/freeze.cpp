#include "model/freeze.hpp"

#include <fmt/format.h>

#include "anvil/error.hpp"

namespace anvil {
namespace {

// One `[...]` set at p (p[0] == '['): whether it holds c; `end` gets the index after its ']'. A '[' without
// a closing ']' matches itself.
bool set_holds(std::string_view p, char c, size_t& end) {
  size_t i = 1;
  const bool negate = i < p.size() && (p[i] == '!' || p[i] == '^');
  if (negate) ++i;
  bool hit = false;
  const size_t first = i;
  for (; i < p.size() && (p[i] != ']' || i == first); ++i) {
    if (i + 2 < p.size() && p[i + 1] == '-' && p[i + 2] != ']') {
      hit |= p[i] <= c && c <= p[i + 2];
      i += 2;
    } else {
      hit |= p[i] == c;
    }
  }
  if (i >= p.size()) {  // no closing bracket: a literal '['
    end = 1;
    return c == '[';
  }
  end = i + 1;
  return hit != negate;
}

}  // namespace

bool glob_match(std::string_view p, std::string_view s) {
  // Iterative matching with one backtrack point for the last '*' (linear in practice).
  size_t pi = 0, si = 0, star = std::string_view::npos, star_s = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      star_s = si;
      continue;
    }
    if (pi < p.size()) {
      size_t step = 1;
      bool ok;
      if (p[pi] == '?')
        ok = true;
      else if (p[pi] == '[')
        ok = set_holds(p.substr(pi), s[si], step);
      else
        ok = p[pi] == s[si];
      if (ok) {
        pi += step;
        ++si;
        continue;
      }
    }
    if (star == std::string_view::npos) return false;
    pi = star + 1;
    si = ++star_s;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

std::vector<std::string> split_patterns(const std::string& list) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= list.size()) {
    size_t e = list.find(',', b);
    if (e == std::string::npos) e = list.size();
    std::string piece = list.substr(b, e - b);
    const size_t l = piece.find_first_not_of(" \t\n"), r = piece.find_last_not_of(" \t\n");
    if (l != std::string::npos) out.push_back(piece.substr(l, r - l + 1));
    b = e + 1;
  }
  return out;
}

FrozenCount count_frozen(const ParamLayout& layout) {
  FrozenCount n;
  for (const ParamTensor& t : layout.tensors())
    if (!t.trainable) ++n.tensors, n.numel += t.numel();
  return n;
}

FrozenCount freeze_parameters(ParamLayout& layout, const std::vector<std::string>& patterns,
                              const std::string& what) {
  const auto& tensors = layout.tensors();
  for (const std::string& pat : patterns) {
    bool matched = false;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const ParamTensor& t = tensors[i];
      bool hit = glob_match(pat, t.name);
      for (const std::string& a : t.aliases) hit = hit || glob_match(pat, a);
      if (!hit) continue;
      matched = true;
      layout.set_trainable(i, false);
    }
    if (!matched) {
      std::string examples;
      for (size_t i = 0; i < tensors.size() && i < 4; ++i) examples += (i ? ", " : "") + tensors[i].name;
      ANVIL_THROW(
          "{}: the pattern '{}' matches no parameter of this model (its names look like {}, ...; patterns "
          "are "
          "globs over whole names: `*` any characters, `?` one, `[0-7]` one of a set)",
          what, pat, examples);
    }
  }
  const FrozenCount n = count_frozen(layout);
  ANVIL_REQUIRE(n.tensors < tensors.size(),
                "{}: the patterns freeze every one of the model's {} tensors, so there is nothing to train; "
                "leave some tensors unmatched",
                what, tensors.size());
  return n;
}

}  // namespace anvil
