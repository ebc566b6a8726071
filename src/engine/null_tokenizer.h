// The tokenizer of an engine started with skip_tokenizer_init: every id decodes to no text and
// nothing can be encoded. Prompts arrive as token ids; outputs carry ids only.
#pragma once

#include <memory>

#include "model/config.h"
#include "tokenizer/tokenizer.h"

namespace specula {

std::unique_ptr<Tokenizer> make_null_tokenizer(const ModelConfig& config);

}  // namespace specula
