// Decimal numbers within bounds, as grammar rules: JSON Schema's minimum / maximum /
// exclusiveMinimum / exclusiveMaximum. Integers in [lo, hi] are the classic digit-range split
// (by length, then by the first digit where the bounds differ), so they are exact. Bounds beyond
// ±(10^18 - 1) are moved inward to it: a value the grammar allows always satisfies the schema;
// integers with more than 18 digits are then not produced.
//
// Bounded numbers (type number) are written without an exponent, `-?I(.F)?`, and the integer part
// I carries the bound: a non-integer bound is rounded inward (minimum 0.5 admits 1, 1.25, ... but
// not 0.75). An integer bound is exact, exclusive ones included (exclusiveMinimum 0 admits 0.5).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "structured_output/grammar.h"

namespace specula {

inline constexpr int64_t kMaxBoundMagnitude = 999'999'999'999'999'999;  // 10^18 - 1

// Integers lo <= n <= hi, either bound optional; "-0" is never produced. Throws specula::Error
// when no integer is in range.
Symbol integer_range(GrammarBuilder& b, std::optional<int64_t> lo, std::optional<int64_t> hi,
                     std::string_view hint = "int_range");

struct NumberBound {
  double value = 0;
  bool exclusive = false;
};

// Numbers within the bounds (at least one given), as documented above. Throws specula::Error when
// the bounds leave no number this form can write.
Symbol number_range(GrammarBuilder& b, std::optional<NumberBound> lo, std::optional<NumberBound> hi,
                    std::string_view hint = "num_range");

}  // namespace specula
