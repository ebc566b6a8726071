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
  std::vector<int32_t> pending, frames;
  for (uint32_t start : rule_starts_[grammar_.root()]) pending.push_back(frame(start, -1));
  bool accepting = false;
  close(pending, frames, accepting);
  initial_ = intern(std::move(frames), accepting);
}

int32_t GrammarAutomaton::frame(uint32_t position, int32_t parent) {
  const uint64_t key = (uint64_t{position} << 32) | static_cast<uint32_t>(parent);
  auto [it, fresh] = frame_ids_.try_emplace(key, static_cast<int32_t>(frames_.size()));
  if (fresh) {
    frames_.push_back({position, parent});
    visited_.push_back(0);
  }
  return it->second;
}

void GrammarAutomaton::close(std::vector<int32_t>& pending, std::vector<int32_t>& out, bool& accepting) {
  // A worklist, not recursion: the frames one position reaches are as many as the stacks alive
  // there, and a call chain that deep would overflow the thread's stack.
  if (++closure_ == 0) {  // wrapped: no stale mark may equal a new closure's number
    std::fill(visited_.begin(), visited_.end(), 0u);
    closure_ = 1;
  }
  size_t visited = 0;
  while (!pending.empty()) {
    const int32_t f = pending.back();
    pending.pop_back();
    if (f < 0) {
      accepting = true;
      continue;
    }
    if (visited_[f] == closure_) continue;
    visited_[f] = closure_;
    if (++visited > kMaxFramesPerPosition) {
      throw GrammarLimitError(fmt::format(
          "grammar: one position of the output reaches more than {} parse frames; the grammar is too "
          "ambiguous to follow (optional or repeated parts nested inside each other, all able to match "
          "nothing, multiply the ways to parse it)",
          kMaxFramesPerPosition));
    }
    const Frame fr = frames_[f];
    if (is_end_[fr.position]) {
      pending.push_back(fr.parent);
      continue;
    }
    const Symbol sym = flat_[fr.position];
    if (sym.kind == Symbol::Kind::kBytes) {
      out.push_back(f);
      continue;
    }
    // A rule last in its sequence returns straight to our caller: no frame for "after it".
    const int32_t cont = is_end_[fr.position + 1] ? fr.parent : frame(fr.position + 1, fr.parent);
    for (uint32_t start : rule_starts_[sym.id]) pending.push_back(frame(start, cont));
  }
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
  std::vector<int32_t> pending, frames;
  for (int32_t f : states_[state].frames) {
    const Frame fr = frames_[f];
    if (!grammar_.byte_set(flat_[fr.position].id).contains(byte)) continue;
    pending.push_back(is_end_[fr.position + 1] ? fr.parent : frame(fr.position + 1, fr.parent));
  }
  bool accepting = false;
  close(pending, frames, accepting);
  // The byte sets this state's frames wait on; collected before intern() may move states_.
  std::vector<uint32_t> sets;
  for (int32_t f : states_[state].frames) sets.push_back(flat_[frames_[f].position].id);
  std::sort(sets.begin(), sets.end());
  sets.erase(std::unique(sets.begin(), sets.end()), sets.end());
  const StateId next = intern(std::move(frames), accepting);
  // Every byte that each of those sets treats as it treats `byte` leads to the same state: one
  // closure serves them all (inside `.{0,300}` a state would otherwise close 255 times over the
  // same thousands of frames).
  std::array<StateId, 256>& next_of = *states_[state].next;
  for (int c = 0; c < 256; ++c) {
    if (next_of[c] >= 0) continue;
    const bool alike = std::all_of(sets.begin(), sets.end(), [&](uint32_t id) {
      const ByteSet& set = grammar_.byte_set(id);
      return set.contains(static_cast<uint8_t>(c)) == set.contains(byte);
    });
    if (alike) next_of[c] = next;
  }
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
