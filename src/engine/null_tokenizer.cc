#include "engine/null_tokenizer.h"

#include "core/error.h"

namespace specula {
namespace {

class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(const ModelConfig& config) : vocab_(config.vocab_size) {
    if (config.bos_token_id) bos_ = static_cast<int32_t>(*config.bos_token_id);
  }
  std::vector<int32_t> encode(std::string_view, bool) const override {
    throw Error("this engine was started without a tokenizer (skip_tokenizer_init): send token ids");
  }
  std::string decode(const std::vector<int32_t>&, bool) const override { return ""; }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> token_to_id(std::string_view) const override { return std::nullopt; }
  std::string id_to_token(int32_t) const override { return ""; }
  std::string token_bytes(int32_t) const override { return ""; }
  bool is_special(int32_t) const override { return false; }
  std::optional<int32_t> bos_token_id() const override { return bos_; }
  // eos comes from generation_config / config.json (the engine adds those ids).
  std::optional<int32_t> eos_token_id() const override { return std::nullopt; }
  std::string bos_token() const override { return ""; }
  std::string eos_token() const override { return ""; }
  bool add_bos_token() const override { return false; }
  const std::string& chat_template() const override { return empty_; }

 private:
  int64_t vocab_;
  std::optional<int32_t> bos_;
  std::string empty_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_null_tokenizer(const ModelConfig& config) {
  return std::make_unique<NullTokenizer>(config);
}

}  // namespace specula
