// The LLMEngine implementation: an EngineCore driven by one loop thread. Callers (HTTP threads)
// only touch a mutex-protected inbox of new requests and aborts and a metrics snapshot; all engine
// state belongs to the loop thread. The loop sleeps on a condition variable while there is nothing
// to run.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "engine/engine_core.h"
#include "engine/llm_engine.h"
#include "engine/model_runner.h"
#include "sampling/sampler.h"
#include "model/config.h"
#include "model/model.h"
#include "engine/speculator.h"
#include "tokenizer/tokenizer.h"

namespace specula {

// Everything an engine is made of, owned by it (declaration order = construction order; the
// executor, which points into the others, goes first on destruction).
struct EngineComponents {
  EngineConfig config;
  ModelConfig model_config;
  GenerationConfig generation_config;
  EngineCoreConfig core_config;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Speculator> speculator;  // speculative decoding (null: off); the executor uses it
  std::unique_ptr<ModelExecutor> executor;
  double step_timeout_seconds = 60.0;  // the step watchdog's (SPECULA_ENGINE_ITERATION_TIMEOUT_S)
};

std::unique_ptr<LLMEngine> make_threaded_engine(EngineComponents components);

}  // namespace specula
