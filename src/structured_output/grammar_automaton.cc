#include "structured_output/grammar_automaton.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace specula {

GrammarAutomaton::GrammarAutomaton(Grammar grammar) : grammar_(std::move(grammar)) {
  rule_starts_.resize(grammar_.num_rules());
  for (uint32_t r = 0; r < grammar_.num_rules(); ++r) {
    for (const Sequence& alt : grammar_.rule(r).alternatives) {
      rule_starts_[r].push_back(static_cast<uint32_t>(flat_.size()));
      for (const Symbol& s : alt) {
        flat_.push_back(s);
        is_end_.push_back(false);
      }
      flat_.push_back({});
      is_end_.push_back(true);
    }
  }
  states_.emplace_back();  // kDead
  state_ids_.emplace(std::string(1, '\0'), kDead);
  std::vector<int32_t> frames, seen;
  bool accepting = false;
  for (uint32_t start : rule_starts_[grammar_.root()]) close(frame(start, -1), frames, accepting, seen);
  initial_ = intern(std::move(frames), accepting);
}

int32_t GrammarAutomaton::frame(uint32_t position, int32_t parent) {
  const uint64_t key = (uint64_t{position} << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = frame_ids_.try_emplace(key, static_cast<int32_t>(frames_.size()));
  if (fresh) frames_.push_back({position, parent});
  return it->second;
}

void GrammarAutomaton::close(int32_t f, std::vector<int32_t>& out, bool& accepting, std::vector<int32_t>& seen) {
  // Iterative would need an explicit stack; recursion depth here is bounded by how deeply rules
  // nest without consuming a byte, which the grammar fixes.
  if (f < 0) {
    accepting = true;
    return;
  }
  if (std::find(seen.begin(), seen.end(), f) != seen.end()) return;
  seen.push_back(f);
  const Frame fr = frames_[f];
  if (is_end_[fr.position]) {
    close(fr.parent, out, accepting, seen);
    return;
  }
  const Symbol sym = flat_[fr.position];
  if (sym.kind == Symbol::Kind::kBytes) {
    out.push_back(f);
    return;
  }
  // A rule last in its sequence returns straight to our caller: no frame for "after it".
  const int32_t cont = is_end_[fr.position + 1] ? fr.parent : frame(fr.position + 1, fr.parent);
  for (uint32_t start : rule_starts_[sym.id]) close(frame(start, cont), out, accepting, seen);
}

GrammarAutomaton::StateId GrammarAutomaton::intern(std::vector<int32_t> frames, bool accepting) {
  std::sort(frames.begin(), frames.end());
  frames.erase(std::unique(frames.begin(), frames.end()), frames.end());
  if (frames.empty() && !accepting) return kDead;
  std::string key(frames.size() * sizeof(int32_t) + 1, '\0');
  key[0] = accepting ? 1 : 2;
  if (!frames.empty()) std::memcpy(key.data() + 1, frames.data(), frames.size() * sizeof(int32_t));
  auto [it, fresh] = state_ids_.try_emplace(std::move(key), static_cast<StateId>(states_.size()));
  if (fresh) {
    State s;
    s.frames = std::move(frames);
    s.accepting = accepting;
    states_.push_back(std::move(s));
  }
  return it->second;
}

GrammarAutomaton::StateId GrammarAutomaton::advance(StateId state, uint8_t byte) {
  if (state == kDead) return kDead;
  if (!states_[state].next) {
    states_[state].next = std::make_unique<std::array<StateId, 256>>();
    states_[state].next->fill(-1);
  }
  StateId cached = (*states_[state].next)[byte];
  if (cached >= 0) return cached;
  std::vector<int32_t> frames, seen;
  bool accepting = false;
  // states_ may grow (and move) inside close/intern: copy what we iterate.
  const std::vector<int32_t> from = states_[state].frames;
  for (int32_t f : from) {
    const Frame fr = frames_[f];
    if (!grammar_.byte_set(flat_[fr.position].id).contains(byte)) continue;
    close(is_end_[fr.position + 1] ? fr.parent : frame(fr.position + 1, fr.parent), frames, accepting, seen);
  }
  const StateId next = intern(std::move(frames), accepting);
  (*states_[state].next)[byte] = next;
  return next;
}

GrammarAutomaton::StateId GrammarAutomaton::advance(StateId state, std::string_view bytes) {
  for (char c : bytes) {
    if (state == kDead) break;
    state = advance(state, static_cast<uint8_t>(c));
  }
  return state;
}

ByteSet GrammarAutomaton::next_bytes(StateId state) const {
  ByteSet out;
  for (int32_t f : states_[state].frames) out |= grammar_.byte_set(flat_[frames_[f].position].id);
  return out;
}

bool grammar_matches(const Grammar& grammar, std::string_view text) {
  GrammarAutomaton a(grammar);
  return a.accepting(a.advance(a.initial(), text));
}

bool grammar_allows_prefix(const Grammar& grammar, std::string_view text) {
  GrammarAutomaton a(grammar);
  return a.advance(a.initial(), text) != GrammarAutomaton::kDead;
}

}  // namespace specula
