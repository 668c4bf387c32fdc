#include "harness/tokenizer/regex.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"

namespace kvb {

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() {
    if (code) pcre2_code_free(code);
  }
};

Regex::Regex(const std::string& pattern) : pattern_(pattern), impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                              &off, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("invalid regular expression '{}' at offset {}: {}", pattern, off, reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation only; the interpreter gives the same matches if it is unavailable.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() = default;

void Regex::scan(std::string_view text, const std::function<void(const size_t*, size_t)>& on) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  // The subject was validated once by the caller; skipping the check on each call keeps this linear.
  uint32_t opts = PCRE2_NO_UTF_CHECK;
  while (pos <= text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), pos, opts, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("regex '{}' failed: {}", pattern_, reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t b = ov[0], e = ov[1];
    if (e == b) {  // empty match: step over one character to make progress
      if (b >= text.size()) break;
      pos = b + utf8_len(static_cast<unsigned char>(text[b]));
      continue;
    }
    on(ov, pcre2_get_ovector_count(md.get()));
    pos = e;
  }
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  scan(text, [&](const size_t* ov, size_t) { out.emplace_back(ov[0], ov[1]); });
  return out;
}

std::vector<Regex::Match> Regex::find_all_groups(std::string_view text) const {
  uint32_t groups = 0;
  pcre2_pattern_info(impl_->code, PCRE2_INFO_CAPTURECOUNT, &groups);
  std::vector<Match> out;
  scan(text, [&](const size_t* ov, size_t pairs) {
    Match m{{ov[0], ov[1]}, {}};
    for (size_t g = 1; g <= groups; ++g)
      m.groups.push_back(g < pairs && ov[2 * g] != PCRE2_UNSET ? std::optional(std::pair(ov[2 * g], ov[2 * g + 1]))
                                                               : std::nullopt);
    out.push_back(std::move(m));
  });
  return out;
}

}  // namespace kvb
