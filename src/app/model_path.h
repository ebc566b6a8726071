// A model argument as vLLM takes it: a folder, or a Hugging Face Hub id ("Qwen/Qwen3-0.6B")
// already in the local Hub cache ($HF_HUB_CACHE, else $HF_HOME/hub, else
// ~/.cache/huggingface/hub: models--ORG--NAME/snapshots/REV/, REV from refs/main). specula never
// downloads: an id that is not there fails saying where it looked.
#pragma once

#include <string>

namespace specula {

// The folder to load `model` from; `model` itself when it is a folder or not shaped like an id
// (the loader then names what is missing).
std::string resolve_model_path(const std::string& model);

}  // namespace specula
