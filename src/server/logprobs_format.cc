#include "server/logprobs_format.h"

#include <fmt/format.h>

#include "server/text_util.h"
#include "tokenizer/tokenizer.h"

namespace specula::server {

using nlohmann::json;

std::string LogprobsFormatter::token_string(int32_t id) const {
  if (as_ids_) return fmt::format("token_id:{}", id);
  return tok_.decode({id}, /*skip_special_tokens=*/false);
}

namespace {

json utf8_bytes(const std::string& s) {
  json bytes = json::array();
  for (unsigned char c : s) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

json LogprobsFormatter::chat_content(const std::vector<PositionLogprobs>& positions, int top_n) const {
  json content = json::array();
  for (const auto& pos : positions) {
    std::string token = token_string(pos.chosen.token_id);
    json top = json::array();
    for (size_t i = 0; i < pos.top.size() && (top_n < 0 || static_cast<int>(i) < top_n); ++i) {
      std::string alt = token_string(pos.top[i].token_id);
      top.push_back({{"token", alt}, {"logprob", clamp_logprob(pos.top[i].logprob)}, {"bytes", utf8_bytes(alt)}});
    }
    content.push_back({{"token", token},
                       {"logprob", clamp_logprob(pos.chosen.logprob)},
                       {"bytes", utf8_bytes(token)},
                       {"top_logprobs", std::move(top)}});
  }
  return content;
}

json LogprobsFormatter::Completion::to_json() const {
  return {{"text_offset", text_offset}, {"token_logprobs", token_logprobs}, {"tokens", tokens}, {"top_logprobs", top_logprobs}};
}

void LogprobsFormatter::append_completion(Completion* acc, int32_t token_id, const std::optional<PositionLogprobs>& lp,
                                          int top_n) const {
  std::string token = token_string(token_id);
  acc->tokens.push_back(token);
  acc->text_offset.push_back(acc->offset);
  acc->offset += utf8_length(token);
  if (!lp) {  // the first prompt token has no logprob
    acc->token_logprobs.push_back(nullptr);
    acc->top_logprobs.push_back(nullptr);
    return;
  }
  acc->token_logprobs.push_back(clamp_logprob(lp->chosen.logprob));
  // As vLLM: the chosen token first, then the top alternatives, at most top_n + 1 entries.
  json top = json::object();
  top[token] = clamp_logprob(lp->chosen.logprob);
  for (size_t i = 0; i < lp->top.size() && static_cast<int>(top.size()) <= top_n; ++i) {
    std::string alt = token_string(lp->top[i].token_id);
    if (!top.contains(alt)) top[alt] = clamp_logprob(lp->top[i].logprob);
  }
  acc->top_logprobs.push_back(std::move(top));
}

json LogprobsFormatter::prompt_logprobs(const std::vector<std::optional<PositionLogprobs>>& positions) const {
  json out = json::array();
  for (const auto& pos : positions) {
    if (!pos) {
      out.push_back(nullptr);
      continue;
    }
    json entry = json::object();
    auto add = [&](const TokenLogprob& t) {
      std::string key = std::to_string(t.token_id);
      if (entry.contains(key)) return;
      entry[key] = {{"logprob", clamp_logprob(t.logprob)}, {"rank", t.rank}, {"decoded_token", token_string(t.token_id)}};
    };
    add(pos->chosen);
    for (const auto& t : pos->top) add(t);
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace specula::server
