#include "model/model.hpp"

#include "model/bert_model.hpp"
#include "model/decoder.hpp"

namespace anvil {

std::unique_ptr<Model> make_model(const TransformerConfig& cfg, int max_batch, int max_seq, bool training,
                                  CheckpointPolicy checkpointing, OpsPrecision precision,
                                  bool share_grad_memory) {
  cfg.validate();  // names an unknown family before either constructor sees it
  if (cfg.is_bert())
    return std::make_unique<BertModel>(cfg, max_batch, max_seq, training, checkpointing, precision,
                                       share_grad_memory);
  return std::make_unique<Decoder>(cfg, max_batch, max_seq, training, checkpointing, precision);
}

}  // namespace anvil
