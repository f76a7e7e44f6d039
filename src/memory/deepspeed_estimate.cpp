#include "memory/deepspeed_estimate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "model/param_layout.hpp"

namespace anvil {
namespace {

// Python's int() of a non-negative float: truncation.
int64_t py_int(double x) {
  return int64_t(x);
}

// " %7.2fGB | %6.2fGB | options", GB = bytes / 2**30, as both estimators print a row.
std::string row_line(const DeepSpeedEstimateRow& r, const std::string& options) {
  return fmt::format(" {:7.2f}GB | {:6.2f}GB | {}\n", double(r.cpu_bytes) / 0x1p30,
                     double(r.gpu_bytes) / 0x1p30, options);
}

// DeepSpeed pads the offload device to 4 characters (f'{OffloadDeviceEnum.cpu:4}').
const char* device(bool offloaded) {
  return offloaded ? "cpu " : "none";
}

std::string header(int gpus_per_node, int num_nodes) {
  return fmt::format(
      "Estimated memory needed for params, optim states and gradients for a:\n"
      "HW: Setup with {} {}, {} {} per node.\n",
      num_nodes, num_nodes > 1 ? "nodes" : "node", gpus_per_node, gpus_per_node > 1 ? "GPUs" : "GPU");
}

}  // namespace

DeepSpeedParamCounts deepspeed_param_counts(const TransformerConfig& model) {
  const ParamLayout layout = model.is_bert() ? ParamLayout::bert(model) : ParamLayout::decoder(model);
  // A module's own parameters: the tensors whose names differ only in their last component.
  std::map<std::string, int64_t> modules;
  DeepSpeedParamCounts c;
  for (const ParamTensor& t : layout.tensors()) {
    int64_t numel = 1;
    for (int64_t d : t.hf_shape()) numel *= d;  // the real vocabulary, not Anvil's padded one
    c.total_params += numel;
    modules[t.name.substr(0, t.name.rfind('.'))] += numel;
  }
  for (const auto& [name, numel] : modules)
    if (numel > c.largest_layer_params) c.largest_layer_params = numel, c.largest_layer = name;
  return c;
}

// stage_1_and_2.py estimate_zero2_model_states_mem_needs. GPU, optimizer offloaded: the 16-bit parameters
// (2 bytes each); not offloaded (PR #5099): 2 bytes + 18 bytes / total GPUs (16-bit and fp32 gradients, fp32
// master weights, Adam's two moments). CPU: the fp32 model as built before partitioning, per process of the
// node, or with offload the fp32 states (16 bytes), times the buffer factor.
std::vector<DeepSpeedEstimateRow> deepspeed_zero2_estimates(int64_t total_params, int gpus_per_node,
                                                            int num_nodes, double buffer_factor) {
  const int64_t total_gpus = int64_t(num_nodes) * gpus_per_node;
  const double P = double(total_params);
  std::vector<DeepSpeedEstimateRow> rows;
  for (bool offload : {true, false}) {
    DeepSpeedEstimateRow r;
    r.offload_optimizer = offload;
    if (offload) {
      r.gpu_bytes = 2 * total_params;
      r.cpu_bytes = py_int(P * double(std::max<int64_t>(4 * total_gpus, 16)) * buffer_factor);
    } else {
      r.gpu_bytes = 2 * total_params + py_int(double(18 * total_params) / double(total_gpus));
      r.cpu_bytes = py_int(P * 4 * gpus_per_node * buffer_factor);
    }
    rows.push_back(r);
  }
  return rows;
}

// stage3.py estimate_zero3_model_states_mem_needs. GPU: the largest layer gathered (16-bit parameters and
// gradients, 4 bytes per parameter) plus the partition kept on the GPU: nothing with both offloaded, the
// 16-bit parameters (2 bytes / total GPUs) with the optimizer offloaded, 18 bytes / total GPUs without
// offload. CPU per node, gpus_factor = 1 / nodes: the offloaded states (18 or 16 bytes per parameter) of the
// node's share, at least the fp32 model each process builds without zero_init; without offload only that
// fp32 model (of the largest layer with zero_init).
std::vector<DeepSpeedEstimateRow> deepspeed_zero3_estimates(int64_t total_params,
                                                            int64_t largest_layer_params, int gpus_per_node,
                                                            int num_nodes, double buffer_factor) {
  const int64_t total_gpus = int64_t(num_nodes) * gpus_per_node;
  const double gpus_factor = 1.0 / num_nodes;
  const double P = double(total_params);
  const int64_t largest_layer_memory = 4 * largest_layer_params;
  // Python's max(int, float) keeps its first argument on a tie; the value is what matters here.
  auto at_least_model = [&](double states) { return std::max(4.0 * gpus_per_node, states * gpus_factor); };
  std::vector<DeepSpeedEstimateRow> rows;
  for (bool offload_optimizer : {true, false})
    for (bool offload_param : {true, false}) {
      if (!offload_optimizer && offload_param) continue;
      for (bool zero_init : {true, false}) {
        DeepSpeedEstimateRow r{offload_param, offload_optimizer, zero_init, 0, 0};
        double cpu = 0;
        if (offload_optimizer && offload_param) {
          r.gpu_bytes = largest_layer_memory;
          cpu = zero_init ? P * 18 * gpus_factor * buffer_factor : P * at_least_model(18) * buffer_factor;
        } else if (offload_optimizer) {
          r.gpu_bytes = largest_layer_memory + py_int(double(2 * total_params) / double(total_gpus));
          cpu = zero_init ? P * 16 * gpus_factor * buffer_factor : P * at_least_model(16) * buffer_factor;
        } else {
          r.gpu_bytes = largest_layer_memory + py_int(double(18 * total_params) / double(total_gpus));
          cpu = zero_init ? double(largest_layer_params) * 4 * gpus_per_node * buffer_factor
                          : P * 4 * gpus_per_node * buffer_factor;
        }
        r.cpu_bytes = py_int(cpu);
        rows.push_back(r);
      }
    }
  return rows;
}

std::string deepspeed_zero2_table(int64_t total_params, int gpus_per_node, int num_nodes) {
  std::string out = header(gpus_per_node, num_nodes);
  out += fmt::format("SW: Model with {}M total params.\n", py_int(double(total_params) / 1e6));
  out += "  per CPU  |  per GPU |   Options\n";
  for (const DeepSpeedEstimateRow& r : deepspeed_zero2_estimates(total_params, gpus_per_node, num_nodes))
    out += row_line(r, fmt::format("offload_optimizer={}", device(r.offload_optimizer)));
  return out;
}

std::string deepspeed_zero3_table(int64_t total_params, int64_t largest_layer_params, int gpus_per_node,
                                  int num_nodes) {
  std::string out = header(gpus_per_node, num_nodes);
  out += fmt::format("SW: Model with {}M total params, {}M largest layer params.\n",
                     py_int(double(total_params) / 1e6), py_int(double(largest_layer_params) / 1e6));
  out += "  per CPU  |  per GPU |   Options\n";
  for (const DeepSpeedEstimateRow& r :
       deepspeed_zero3_estimates(total_params, largest_layer_params, gpus_per_node, num_nodes))
    out +=
        row_line(r, fmt::format("offload_param={}, offload_optimizer={}, zero_init={}",
                                device(r.offload_param), device(r.offload_optimizer), r.zero_init ? 1 : 0));
  return out;
}

}  // namespace anvil
