#include "app/model_path.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace specula {

namespace fs = std::filesystem;

namespace {

fs::path hub_cache_dir() {
  for (const char* var : {"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"})
    if (const char* v = std::getenv(var); v && *v) return v;
  if (const char* home = std::getenv("HF_HOME"); home && *home) return fs::path(home) / "hub";
  const char* user_home = std::getenv("HOME");
  return fs::path(user_home ? user_home : "/root") / ".cache" / "huggingface" / "hub";
}

// The snapshot refs/main names, else the newest one.
fs::path pick_snapshot(const fs::path& repo) {
  std::ifstream ref(repo / "refs" / "main");
  std::string rev;
  if (ref && std::getline(ref, rev) && fs::is_directory(repo / "snapshots" / rev)) return repo / "snapshots" / rev;
  fs::path newest;
  fs::file_time_type newest_time{};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(repo / "snapshots", ec)) {
    if (!e.is_directory()) continue;
    const auto t = e.last_write_time(ec);
    if (newest.empty() || t > newest_time) {
      newest = e.path();
      newest_time = t;
    }
  }
  return newest;
}

}  // namespace

std::string resolve_model_path(const std::string& model) {
  std::error_code ec;
  if (model.empty() || fs::is_directory(model, ec)) return model;
  static const std::regex hub_id(R"(^[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$)");
  if (!std::regex_match(model, hub_id)) return model;
  const fs::path repo = hub_cache_dir() / ("models--" + model.substr(0, model.find('/')) + "--" +
                                           model.substr(model.find('/') + 1));
  const fs::path snapshot = fs::is_directory(repo / "snapshots", ec) ? pick_snapshot(repo) : fs::path();
  SPECULA_CHECK(!snapshot.empty() && fs::exists(snapshot / "config.json", ec),
                "{}: no such folder, and not in the local Hugging Face cache (looked for {}). specula does not "
                "download models: fetch it first (e.g. `huggingface-cli download {}`) or pass its folder",
                model, (repo / "snapshots" / "<revision>" / "config.json").string(), model);
  return snapshot.string();
}

}  // namespace specula
