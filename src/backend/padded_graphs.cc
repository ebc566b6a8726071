#include "backend/padded_graphs.h"

#include "core/error.h"

namespace specula {

std::vector<int> PaddedGraphs::default_sizes(int max_size) {
  std::vector<int> sizes;
  for (int s : {1, 2, 4})
    if (s <= max_size) sizes.push_back(s);
  for (int s = 8; s <= max_size; s += 8) sizes.push_back(s);
  if (max_size > 0 && (sizes.empty() || sizes.back() != max_size)) sizes.push_back(max_size);
  return sizes;
}

void PaddedGraphs::capture(const std::vector<int>& sizes, const std::function<void(int size)>& work) {
  for (int size : sizes) {
    SPECULA_CHECK(size > 0, "graph capture: batch size {} must be positive", size);
    work(size);              // warm-up, eagerly
    backend_.reset_scratch();  // lets the arena grow to this step's size before capture
    try {
      const auto once = [&] { work(size); };
      std::unique_ptr<DeviceGraph> graph = record_ ? record_(once) : backend_.capture_graph(once);
      if (!graph) return;  // the backend has no graphs
      graphs_[size] = std::move(graph);
    } catch (const Error& e) {
      throw Error(fmt::format("capturing the graph for batch size {}: {}", size, e.what()));
    }
  }
}

int PaddedGraphs::padded_size(int n) const {
  auto it = graphs_.lower_bound(n);
  return it == graphs_.end() ? 0 : it->first;
}

bool PaddedGraphs::replay(int size) {
  auto it = graphs_.find(size);
  if (it == graphs_.end()) return false;
  it->second->replay();
  return true;
}

std::vector<int> PaddedGraphs::sizes() const {
  std::vector<int> out;
  for (const auto& [s, g] : graphs_) out.push_back(s);
  return out;
}

}  // namespace specula
