#include "train/task.hpp"

namespace anvil {

std::unique_ptr<Task> make_task(const TrainConfig& cfg, const RunData& data, const TransformerConfig& model,
                                std::unique_ptr<data::Tokenizer> tokenizer) {
  if (data.classification) return make_classification_task(cfg, data, model);
  return make_causal_lm_task(data, model, std::move(tokenizer));
}

}  // namespace anvil
