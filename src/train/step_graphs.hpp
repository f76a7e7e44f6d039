// CUDA graphs of the train step (cuda_graphs). A part of a step whose work is all on the device is recorded
// once and replayed with one launch: its kernels read the step's learning rate, bias terms, seeds and
// unscale factor from the engine's step values, which the graph itself uploads from pinned memory the host
// rewrote for this step. The parts (train_step.cpp says which a step uses):
//   Step    the whole step (gradient zeroing, forward, backward, loss sum, norm, clip, optimizer, weight
//   cast) Micro   one micro-batch's forward, backward and loss sum; MicroReduce the same for a step's last
//   micro-batch when several processes reduce its gradients during its backward (gradients by unit: every
//   micro-batch); MicroReduceFirst the step's first where it differs (offloaded gradients: it overwrites
//   them); Tail    the step's tail:
//   gradient norm to weight cast Norm    the gradient norm and the optimizer's multiplier (fp16: the host
//   decides before the update) Update  the optimizer and the weight cast
// Graphs are kept per part, input slot and batch shape. A graph is recorded at the second use of its key (the
// first runs eagerly: it builds the attention plans and GEMM algorithm choices the recording then keeps).
// Graphs bake in the loss-gradient scale, so an fp16 scale change records them again.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>

#include "runtime/device.hpp"

namespace anvil {

class StepGraphs {
 public:
  enum class Part { Step, Micro, MicroReduce, MicroReduceFirst, Tail, Norm, Update };

  explicit StepGraphs(Device& dev) : dev_(dev) {}

  // Runs `work` eagerly, or records / replays it as the graph of (part, slot, B, T); true when replayed.
  bool run(bool eager, Part part, int slot, int B, int T, float grad_scale,
           const std::function<void()>& work);

  int64_t recorded() const { return recorded_; }
  int64_t launches() const { return launches_; }

 private:
  struct Cached {
    std::unique_ptr<Device::Graph> graph;
    float grad_scale = 0;
    int64_t uses = 0;
  };
  Device& dev_;
  std::map<std::tuple<Part, int, int, int>, Cached> graphs_;
  int64_t recorded_ = 0, launches_ = 0;
};

}  // namespace anvil
