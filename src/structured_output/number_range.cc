#include "structured_output/number_range.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace specula {

namespace {

using Alternatives = std::vector<Sequence>;

Symbol digit_in(GrammarBuilder& b, char lo, char hi) {
  return b.bytes(ByteSet::range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)));
}

// Digit strings of equal length between lo and hi (inclusive, lo <= hi).
void same_length(GrammarBuilder& b, const std::string& lo, const std::string& hi, Sequence prefix, Alternatives& out) {
  if (lo.empty()) {
    out.push_back(std::move(prefix));
    return;
  }
  if (lo[0] == hi[0]) {
    prefix.push_back(digit_in(b, lo[0], lo[0]));
    same_length(b, lo.substr(1), hi.substr(1), std::move(prefix), out);
    return;
  }
  const size_t rest = lo.size() - 1;
  const bool lo_rest_zero = lo.find_first_not_of('0', 1) == std::string::npos;
  const bool hi_rest_nine = hi.find_first_not_of('9', 1) == std::string::npos;
  const char first_full = lo_rest_zero ? lo[0] : static_cast<char>(lo[0] + 1);
  const char last_full = hi_rest_nine ? hi[0] : static_cast<char>(hi[0] - 1);
  if (!lo_rest_zero) {
    Sequence p = prefix;
    p.push_back(digit_in(b, lo[0], lo[0]));
    same_length(b, lo.substr(1), std::string(rest, '9'), std::move(p), out);
  }
  if (first_full <= last_full) {
    Sequence p = prefix;
    p.push_back(digit_in(b, first_full, last_full));
    for (size_t i = 0; i < rest; ++i) p.push_back(digit_in(b, '0', '9'));
    out.push_back(std::move(p));
  }
  if (!hi_rest_nine) {
    Sequence p = prefix;
    p.push_back(digit_in(b, hi[0], hi[0]));
    same_length(b, std::string(rest, '0'), hi.substr(1), std::move(p), out);
  }
}

// Non-negative integers in [lo, hi] (hi absent: unbounded), no leading zeros, each preceded by
// `prefix`.
void uint_range(GrammarBuilder& b, uint64_t lo, std::optional<uint64_t> hi, const Sequence& prefix, Alternatives& out,
                std::string_view hint) {
  if (hi && *hi < lo) return;
  const std::string l = std::to_string(lo);
  const size_t max_len = hi ? std::to_string(*hi).size() : l.size();
  for (size_t len = l.size(); len <= max_len; ++len) {
    std::string from = len == l.size() ? l : "1" + std::string(len - 1, '0');
    std::string to = hi && len == max_len ? std::to_string(*hi) : std::string(len, '9');
    same_length(b, from, to, prefix, out);
  }
  if (!hi) {  // any longer number
    Sequence p = prefix;
    p.push_back(digit_in(b, '1', '9'));
    for (size_t i = 0; i < l.size(); ++i) p.push_back(digit_in(b, '0', '9'));
    p.push_back(b.star({digit_in(b, '0', '9')}, hint));
    out.push_back(std::move(p));
  }
}

int64_t clamp_bound(int64_t v) { return std::max(-kMaxBoundMagnitude, std::min(kMaxBoundMagnitude, v)); }

// Integers in [lo, hi] as alternatives; "-0" excluded.
void int_alternatives(GrammarBuilder& b, std::optional<int64_t> lo, std::optional<int64_t> hi, Alternatives& out,
                      std::string_view hint) {
  if (lo) lo = clamp_bound(*lo);
  if (hi) hi = clamp_bound(*hi);
  if (lo && hi && *lo > *hi) return;
  if (!hi || *hi >= 0) {
    uint64_t from = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    std::optional<uint64_t> to;
    if (hi) to = static_cast<uint64_t>(*hi);
    uint_range(b, from, to, {}, out, hint);
  }
  if (!lo || *lo < 0) {
    uint64_t from = hi && *hi < 0 ? static_cast<uint64_t>(-*hi) : 1;
    std::optional<uint64_t> to;
    if (lo) to = static_cast<uint64_t>(-*lo);
    uint_range(b, from, to, b.literal("-"), out, hint);
  }
}

}  // namespace

Symbol integer_range(GrammarBuilder& b, std::optional<int64_t> lo, std::optional<int64_t> hi, std::string_view hint) {
  Alternatives alts;
  int_alternatives(b, lo, hi, alts, hint);
  SPECULA_CHECK(!alts.empty(), "no integer lies between the bounds {} and {}", lo ? std::to_string(*lo) : "-inf",
                hi ? std::to_string(*hi) : "inf");
  return b.choice(std::move(alts), hint);
}

namespace {

double clamp_double(double v) {
  const double m = static_cast<double>(kMaxBoundMagnitude);
  return std::max(-m, std::min(m, v));
}

// Magnitudes m = I(.F)? with m in the interval from `a` to `b` (a >= 0; b absent: unbounded),
// each alternative preceded by `sign`.
void magnitudes(GrammarBuilder& b, NumberBound a, std::optional<NumberBound> hi, const Sequence& sign,
                Alternatives& out, std::string_view hint) {
  Symbol digit = digit_in(b, '0', '9');
  Symbol fraction = b.optional({b.bytes(ByteSet::of('.')), b.plus({digit}, hint)}, hint);
  const bool a_integer = std::floor(a.value) == a.value;
  // The integer parts whose every fraction lies in range.
  int64_t i_lo = a.exclusive ? static_cast<int64_t>(std::floor(a.value)) + 1 : static_cast<int64_t>(std::ceil(a.value));
  std::optional<int64_t> i_hi;
  if (hi) i_hi = static_cast<int64_t>(std::floor(hi->value)) - 1;
  auto add = [&](Alternatives from, bool with_fraction) {
    for (Sequence& s : from) {
      Sequence full = sign;
      full.insert(full.end(), s.begin(), s.end());
      if (with_fraction) full.push_back(fraction);
      out.push_back(std::move(full));
    }
  };
  Alternatives parts;
  if (!i_hi || i_lo <= *i_hi) uint_range(b, static_cast<uint64_t>(i_lo), i_hi ? std::optional<uint64_t>(*i_hi) : std::nullopt, {}, parts, hint);
  add(std::move(parts), true);
  // The upper end E = floor(b) itself, with no fraction.
  if (hi) {
    const int64_t e = static_cast<int64_t>(std::floor(hi->value));
    const bool e_ok = !(hi->exclusive && static_cast<double>(e) == hi->value) &&
                      (a.exclusive ? static_cast<double>(e) > a.value : static_cast<double>(e) >= a.value);
    if (e_ok && e >= 0) {
      Alternatives exact;
      uint_range(b, static_cast<uint64_t>(e), static_cast<uint64_t>(e), {}, exact, hint);
      add(std::move(exact), false);
    }
  }
  // An exclusive integer lower end A: A itself with a fraction that is not all zeros.
  if (a.exclusive && a_integer && (!hi || a.value + 1 <= hi->value)) {
    const auto av = static_cast<uint64_t>(a.value);
    Alternatives base;
    uint_range(b, av, av, {}, base, hint);
    for (Sequence& s : base) {
      Sequence full = sign;
      full.insert(full.end(), s.begin(), s.end());
      full.push_back(b.bytes(ByteSet::of('.')));
      full.push_back(b.star({digit}, hint));
      full.push_back(digit_in(b, '1', '9'));
      full.push_back(b.star({digit}, hint));
      out.push_back(std::move(full));
    }
  }
}

}  // namespace

Symbol number_range(GrammarBuilder& b, std::optional<NumberBound> lo, std::optional<NumberBound> hi,
                    std::string_view hint) {
  SPECULA_CHECK(lo || hi, "number_range needs a bound");
  SPECULA_CHECK((!lo || std::isfinite(lo->value)) && (!hi || std::isfinite(hi->value)), "number bounds must be finite");
  if (lo) lo->value = clamp_double(lo->value);
  if (hi) hi->value = clamp_double(hi->value);
  Alternatives alts;
  // Non-negative values: magnitudes in [max(lo, 0), hi].
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    NumberBound a = lo && lo->value >= 0 ? *lo : NumberBound{0, false};
    magnitudes(b, a, hi, {}, alts, hint);
  }
  // Negative values: magnitudes in (max(-hi, 0), -lo], written after '-'.
  if (!lo || lo->value < 0) {
    NumberBound a = hi && hi->value <= 0 ? NumberBound{-hi->value, hi->exclusive} : NumberBound{0, true};
    std::optional<NumberBound> m;
    if (lo) m = NumberBound{-lo->value, lo->exclusive};
    magnitudes(b, a, m, b.literal("-"), alts, hint);
  }
  SPECULA_CHECK(!alts.empty(), "no number this grammar can write lies between the bounds {} and {}",
                lo ? std::to_string(lo->value) : "-inf", hi ? std::to_string(hi->value) : "inf");
  return b.choice(std::move(alts), hint);
}

}  // namespace specula
