#include "structured_output/code_point_set.h"

#include <algorithm>

namespace specula {

CodePointSet CodePointSet::range(uint32_t lo, uint32_t hi) {
  CodePointSet s;
  s.add(lo, hi);
  return s;
}

void CodePointSet::add(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMax);
  if (lo > hi) return;
  // Insert, then merge overlapping or adjacent neighbours.
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), Range{lo, hi});
  it = ranges_.insert(it, {lo, hi});
  size_t i = static_cast<size_t>(it - ranges_.begin());
  if (i > 0 && ranges_[i - 1].second + 1 >= ranges_[i].first) --i;
  while (i + 1 < ranges_.size() && ranges_[i].second + 1 >= ranges_[i + 1].first) {
    ranges_[i].second = std::max(ranges_[i].second, ranges_[i + 1].second);
    ranges_.erase(ranges_.begin() + static_cast<std::ptrdiff_t>(i) + 1);
  }
}

void CodePointSet::add(const CodePointSet& o) {
  for (auto [lo, hi] : o.ranges_) add(lo, hi);
}

CodePointSet CodePointSet::complement() const {
  CodePointSet out;
  uint32_t next = 0;
  for (auto [lo, hi] : ranges_) {
    if (lo > next) out.ranges_.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMax) out.ranges_.emplace_back(next, kMax);
  return out;
}

CodePointSet CodePointSet::minus(const CodePointSet& o) const {
  CodePointSet keep = o.complement(), out;
  // Intersection of two sorted range lists.
  size_t a = 0, b = 0;
  while (a < ranges_.size() && b < keep.ranges_.size()) {
    uint32_t lo = std::max(ranges_[a].first, keep.ranges_[b].first);
    uint32_t hi = std::min(ranges_[a].second, keep.ranges_[b].second);
    if (lo <= hi) out.ranges_.emplace_back(lo, hi);
    if (ranges_[a].second < keep.ranges_[b].second) ++a; else ++b;
  }
  return out;
}

bool CodePointSet::contains(uint32_t cp) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), Range{cp, kMax + 1});
  return it != ranges_.begin() && std::prev(it)->second >= cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

bool decode_utf8(std::string_view text, size_t& pos, uint32_t& cp) {
  if (pos >= text.size()) return false;
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
  if (len == 0 || pos + len > text.size()) return false;
  uint32_t v = len == 1 ? b0 : len == 2 ? (b0 & 0x1f) : len == 3 ? (b0 & 0x0f) : (b0 & 0x07);
  for (int i = 1; i < len; ++i) {
    if ((byte(pos + i) & 0xc0) != 0x80) return false;
    v = (v << 6) | (byte(pos + i) & 0x3f);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[len] || v > CodePointSet::kMax || (v >= 0xd800 && v <= 0xdfff)) return false;
  cp = v;
  pos += len;
  return true;
}

}  // namespace specula
