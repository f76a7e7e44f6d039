// The Unicode helpers behind the tokenizers: UTF-8 decoding with U+FFFD per maximal ill-formed
// subpart, and the generated character tables (classes, lower case, accent stripping).
#include <gtest/gtest.h>

#include "data/unicode.hpp"

namespace anvil {
namespace {

namespace u = data::unicode;

std::string valid(std::string_view s, size_t* replaced = nullptr) {
  std::string out;
  const size_t n = u::to_valid_utf8(s, out);
  if (replaced) *replaced = n;
  return out;
}

TEST(TokenizerUnicode, DecodesUtf8AndReplacesMaximalSubparts) {
  EXPECT_EQ(u::decode_utf8("\xE2\x82\xAC", 0).cp, 0x20ACu);
  EXPECT_EQ(u::decode_utf8("\xF0\x9F\x98\x80", 0).len, 4u);
  const std::string r = "\xEF\xBF\xBD";  // U+FFFD
  size_t n = 0;
  // The same results as Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(valid("a\x80"
                  "b",
                  &n),
            "a" + r + "b");
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(valid("\xE2\x82(", &n), r + "(");  // truncated 3-byte sequence: one replacement
  EXPECT_EQ(n, 1u);
  EXPECT_EQ(valid("\xE0\x80\x80", &n), r + r + r);  // overlong: E0 must be followed by A0..BF
  EXPECT_EQ(n, 3u);
  EXPECT_EQ(valid("\xED\xA0\x80"), r + r + r);          // a UTF-16 surrogate
  EXPECT_EQ(valid("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(valid("\xC0\xAF\xF8\xFF"), r + r + r + r);  // never-valid bytes
  EXPECT_EQ(valid("\xF0\x9F\x98"), r);                  // truncated at the end
  EXPECT_EQ(valid("ok \xC3\xA9 \xF0\x9F\x98\x80", &n), "ok \xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(n, 0u);
  EXPECT_TRUE(u::is_valid_utf8("plain ascii that is longer than eight bytes \xC3\xA9"));
  EXPECT_FALSE(u::is_valid_utf8("plain ascii that is longer than eight bytes \xC3"));
  std::string s;
  for (char32_t c : {U'A', U'é', U'€', U'😀'}) u::append_utf8(s, c);
  EXPECT_EQ(s, "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
}

TEST(TokenizerUnicode, CharacterClasses) {
  EXPECT_TRUE(u::is_white_space(U' ') && u::is_white_space(U'\u3000') && u::is_white_space(U'\u0085'));
  EXPECT_FALSE(u::is_white_space(U'\u200B') || u::is_white_space(U'\u180E') || u::is_white_space(U'x'));
  EXPECT_TRUE(u::flags(U'\u00AD') & u::kBertControl);  // soft hyphen (Cf)
  EXPECT_TRUE(u::flags(U'\uE000') & u::kBertControl);  // private use
  EXPECT_FALSE(u::flags(U'\t') & u::kBertControl);
  EXPECT_TRUE(u::flags(U'$') & u::kBertPunct);       // ASCII symbols count as punctuation for BERT
  EXPECT_TRUE(u::flags(U'\u3002') & u::kBertPunct);  // 。
  EXPECT_FALSE(u::flags(U'€') & u::kBertPunct);
  EXPECT_TRUE(u::flags(U'\u4E2D') & u::kCjk);
  EXPECT_FALSE(u::flags(U'\u3042') & u::kCjk);  // kana are not isolated
  EXPECT_TRUE(u::flags(U'\u0301') & u::kNonspacing);
  EXPECT_TRUE((u::flags(U'é') & u::kWordChar) && (u::flags(U'_') & u::kWordChar));
  EXPECT_FALSE(u::flags(U'-') & u::kWordChar);
}

TEST(TokenizerUnicode, LowerCaseAndAccentStripping) {
  char32_t out[3];
  const auto lower = [&](char32_t c) { return std::u32string(out, out + u::to_lower(c, out)); };
  const auto strip = [&](char32_t c) { return std::u32string(out, out + u::strip_accents(c, out)); };
  EXPECT_EQ(lower(U'A'), U"a");
  EXPECT_EQ(lower(U'Ä'), U"ä");
  EXPECT_EQ(lower(U'Σ'), U"σ");
  EXPECT_EQ(lower(U'Ж'), U"ж");
  EXPECT_EQ(lower(U'İ'), U"i\u0307");
  EXPECT_EQ(lower(U'ǅ'), U"ǆ");
  EXPECT_EQ(lower(U'\U00010400'), U"\U00010428");  // Deseret
  EXPECT_EQ(lower(U'ß'), U"ß");
  EXPECT_EQ(lower(U'1'), U"1");
  EXPECT_EQ(strip(U'é'), U"e");
  EXPECT_EQ(strip(U'Å'), U"A");
  EXPECT_EQ(strip(U'\u212B'), U"A");  // Angstrom sign
  EXPECT_EQ(strip(U'ǖ'), U"u");       // two marks
  EXPECT_EQ(strip(U'\u0301'), U"");   // a lone mark
  EXPECT_EQ(strip(U'ø'), U"ø");       // no decomposition
  EXPECT_EQ(strip(U'한'), U"\u1112\u1161\u11AB");
  EXPECT_EQ(strip(U'\u1E9B'), U"\u017F");  // ẛ -> ſ
}

}  // namespace
}  // namespace anvil
