#include "train/step_graphs.hpp"

namespace anvil {

bool StepGraphs::run(bool eager, Part part, int slot, int B, int T, float grad_scale,
                     const std::function<void()>& work) {
  if (eager) return work(), false;
  Cached& g = graphs_[{part, slot, B, T}];
  if (g.uses++ == 0) return work(), false;
  if (!g.graph || g.grad_scale != grad_scale) {
    g.graph = dev_.capture(work);
    g.grad_scale = grad_scale;
    ++recorded_;
  }
  g.graph->launch();
  ++launches_;
  return true;
}

}  // namespace anvil
