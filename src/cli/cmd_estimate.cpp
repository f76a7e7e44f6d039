// anvil estimate: the memory plan of a training config, without running it.
#include <memory>

#include "cli/config_flags.hpp"
#include "train/engine.hpp"
#include "train/run_model.hpp"

namespace anvil::cli {
namespace {

Command make_estimate(CLI::App& parent) {
  auto flags = std::make_shared<ConfigFlags>();
  CLI::App* app =
      parent.add_subcommand("estimate", "print the memory plan of a training config without running it");
  flags->add_to(app);
  return {app, [flags] {
            const TrainConfig cfg = flags->resolve();
            const TransformerConfig model = resolve_run_model(cfg).config;
            const EngineOptions o = training_engine_options(cfg);
            const MemoryPlan plan = plan_engine_memory(model, o);
            fmt::print(
                "Memory plan for training gpt2 ({:.2f}M parameters), batch {} x {} tokens, fp32 AdamW, "
                "checkpointing {}, on {}:\n",
                model.num_parameters() / 1e6, o.batch_size, o.seq_len,
                checkpoint_mode_name(o.checkpointing.mode), device_name(o.device));
            fmt::print("{}", plan.report(true));
            return 0;
          }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(20, make_estimate);

}  // namespace anvil::cli
