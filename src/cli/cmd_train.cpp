// anvil train: run a training job.
#include <memory>

#include "anvil/trainer.hpp"
#include "cli/config_flags.hpp"

namespace anvil::cli {
namespace {

double mib(size_t bytes) {
  return double(bytes) / (1 << 20);
}

// The seed's summary, every figure with its unit (memory in MiB throughout).
void print_summary(const TrainSummary& s) {
  fmt::print("\n***** train metrics *****\n");
  fmt::print("  Time: {:.2f} s\n", s.train_runtime);
  fmt::print("  Samples/second: {:.2f}\n", s.train_samples_per_second);
  fmt::print("  Tokens/second: {:.0f}{}\n", s.train_tokens_per_second,
             s.world_size > 1 ? fmt::format(" ({} processes; {:.0f} per process)", s.world_size,
                                            s.train_tokens_per_second / s.world_size)
                              : "");
  fmt::print("  train_loss: {:.4f}\n", s.train_loss);
  fmt::print("  data wait: {:.3f} s ({:.2f}% of the time)\n", s.data_wait_seconds,
             s.train_runtime > 0 ? 100.0 * s.data_wait_seconds / s.train_runtime : 0.0);
  if (s.comm_seconds >= 0)
    fmt::print("  communication (rank 0): {:.3f} s, {:.3f} s of it not overlapped ({:.2f}% of the time)\n",
               s.comm_seconds, s.comm_exposed_seconds,
               s.train_runtime > 0 ? 100.0 * s.comm_exposed_seconds / s.train_runtime : 0.0);
  if (s.offload_update_seconds >= 0)
    fmt::print(
        "  optimizer offload (rank 0): gradients to the host {:.3f} s, update on the CPU {:.3f} s, weights "
        "to the "
        "device {:.3f} s\n",
        s.offload_grads_down_seconds, s.offload_update_seconds, s.offload_weights_up_seconds);
  if (s.nvme_read_gib >= 0) {
    const auto rate = [](double gib, double seconds) { return seconds > 0 ? gib / seconds : 0.0; };
    fmt::print(
        "  NVMe swap file (rank 0): read {:.2f} GiB in {:.3f} s ({:.2f} GiB/s), wrote {:.2f} GiB in {:.3f} s "
        "({:.2f} GiB/s)\n",
        s.nvme_read_gib, s.nvme_read_seconds, rate(s.nvme_read_gib, s.nvme_read_seconds), s.nvme_write_gib,
        s.nvme_write_seconds, rate(s.nvme_write_gib, s.nvme_write_seconds));
  }
  if (s.weights_read_gib >= 0) {
    const auto rate = [](double gib, double seconds) { return seconds > 0 ? gib / seconds : 0.0; };
    fmt::print(
        "  NVMe weights (rank 0): read {:.2f} GiB in {:.3f} s ({:.2f} GiB/s), wrote {:.2f} GiB in {:.3f} s "
        "({:.2f} GiB/s); {} pieces gathered, {} of them not read ahead\n",
        s.weights_read_gib, s.weights_read_seconds, rate(s.weights_read_gib, s.weights_read_seconds),
        s.weights_write_gib, s.weights_write_seconds, rate(s.weights_write_gib, s.weights_write_seconds),
        s.weight_pieces_served, s.weight_pieces_on_demand);
  }
  if (s.eval_loss >= 0) fmt::print("  eval_loss: {:.4f}\n", s.eval_loss);
  if (s.eval_accuracy >= 0) fmt::print("  eval_accuracy: {:.4f}\n", s.eval_accuracy);
  fmt::print("  {} memory occupied: {:.0f} MiB.\n", s.device.rfind("cpu", 0) == 0 ? "CPU arena" : "GPU",
             mib(s.peak_memory_bytes));
  fmt::print("  allocator peak: {:.1f} MiB (plan: {:.1f} MiB)\n", mib(s.allocator_peak_bytes),
             mib(s.planned_memory_bytes));
  if (!s.last_checkpoint.empty()) fmt::print("  checkpoint: {}\n", s.last_checkpoint);
  if (!s.sample.empty()) fmt::print("\n***** sample *****\n{}\n", s.sample);
}

Command make_train(CLI::App& parent) {
  auto flags = std::make_shared<ConfigFlags>();
  CLI::App* app = parent.add_subcommand("train", "train a model (config file + flag overrides)");
  flags->add_to(app);
  return {app, [flags] {
            const TrainSummary s = train(flags->resolve());
            if (s.rank == 0) print_summary(s);
            return 0;
          }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(10, make_train);

}  // namespace anvil::cli
