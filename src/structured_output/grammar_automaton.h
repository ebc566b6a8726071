// A Grammar run as a pushdown automaton over bytes, with its states made on demand and kept.
//
// A parse position is a stack of grammar positions (the symbol to match next, and where each rule
// returns to); the grammar may be ambiguous, so a state is the set of stacks alive after the input
// so far. Stacks are immutable linked frames, interned, so a state is a sorted list of frame ids
// and is itself interned: equal parse situations get one StateId wherever they arise, which lets
// byte transitions and token masks be cached per state (token_mask.h). A rule referenced last in
// its sequence is a tail call (no return frame), so right recursion (star, repeat) keeps stacks flat.
//
// Not thread-safe: states are created as inputs reach them; one thread (the engine's) drives it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "structured_output/grammar.h"

namespace specula {

// A grammar whose parse outgrows what one position may hold (kMaxFramesPerPosition): the
// constraint is refused, not followed at any cost.
class GrammarLimitError : public Error {
 public:
  using Error::Error;
};

class GrammarAutomaton {
 public:
  using StateId = int32_t;
  static constexpr StateId kDead = 0;  // no stack survives: the input left the grammar
  // Frames one position may reach (the stacks alive there, and the rule entries and returns on
  // the way). Ambiguity multiplies stacks: rules that can all match nothing, nested k deep, reach
  // 2^k. Beyond this bound advance() and the constructor throw GrammarLimitError. Schemas, regexes
  // and JSON grammars as requests send them reach tens to hundreds; an object of 300 optional
  // properties ~1,500.
  static constexpr size_t kMaxFramesPerPosition = 1 << 14;

  explicit GrammarAutomaton(Grammar grammar);

  const Grammar& grammar() const { return grammar_; }
  StateId initial() const { return initial_; }
  StateId advance(StateId state, uint8_t byte);
  StateId advance(StateId state, std::string_view bytes);  // kDead as soon as a byte fails
  // The input so far is a whole match of the root rule.
  bool accepting(StateId state) const { return states_[state].accepting; }
  // Some byte may follow (false for kDead and for a match that cannot grow).
  bool can_continue(StateId state) const { return !states_[state].frames.empty(); }
  // The bytes some stack of `state` may consume next.
  ByteSet next_bytes(StateId state) const;
  size_t num_states() const { return states_.size(); }

 private:
  // A stack frame: the flat position of the symbol to match next, and the frame to return to once
  // this rule's sequence ends (-1: the root's end).
  struct Frame {
    uint32_t position;
    int32_t parent;
  };
  struct State {
    std::vector<int32_t> frames;  // sorted ids; each frame's position is a byte-set symbol
    bool accepting = false;
    std::unique_ptr<std::array<StateId, 256>> next;  // transitions, filled on first use (-1: unknown)
  };

  int32_t frame(uint32_t position, int32_t parent);
  // Adds to `out` the frames reachable from those in `pending` (which it empties) without
  // consuming a byte whose next symbol is a byte set; sets `accepting` when the root can end.
  void close(std::vector<int32_t>& pending, std::vector<int32_t>& out, bool& accepting);
  StateId intern(std::vector<int32_t> frames, bool accepting);

  Grammar grammar_;
  // The grammar flattened: each alternative's symbols followed by an end marker.
  std::vector<Symbol> flat_;
  std::vector<bool> is_end_;
  std::vector<std::vector<uint32_t>> rule_starts_;  // rule -> the flat position of each alternative
  std::vector<Frame> frames_;
  std::vector<uint32_t> visited_;  // per frame: the last closure that reached it
  uint32_t closure_ = 0;           // closures run so far
  std::unordered_map<uint64_t, int32_t> frame_ids_;
  std::vector<State> states_;
  std::unordered_map<std::string, StateId> state_ids_;  // key: the frame ids' bytes + accepting
  StateId initial_ = kDead;
};

// Conveniences for tests and one-off checks.
bool grammar_matches(const Grammar& grammar, std::string_view text);        // the whole text
bool grammar_allows_prefix(const Grammar& grammar, std::string_view text);  // text can still grow into a match

}  // namespace specula
