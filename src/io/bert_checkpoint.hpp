// Hugging Face BERT model directories (config.json + model.safetensors, or sharded safetensors): loading into
// a BertModel and exporting from one. The GPT-2 side lives in checkpoint.hpp; read_model_config() there reads
// either family's config.json.
//
// Names: BertForSequenceClassification's ("bert.encoder.layer.0.attention.self.query.weight", ...,
// "bert.pooler.dense.weight", "classifier.weight"). The loader also takes BertModel checkpoints (the same
// names without the "bert." prefix, e.g. sentence-transformers models), the old "LayerNorm.gamma/beta"
// spelling of LayerNorm parameters, and ignores the pre-training heads ("cls.*") and position / token-type id
// buffers. Hugging Face's BERT Linear weights are [out, in] like Anvil's, so nothing is transposed.
#pragma once
#include <string>
#include <vector>

#include "model/bert_model.hpp"
#include "runtime/device.hpp"

namespace anvil::io {

// Writes model.safetensors (fp32, BertForSequenceClassification names) and config.json into `dir` (an
// existing directory): a directory transformers' BertForSequenceClassification.from_pretrained loads.
void save_bert_model(const std::string& dir, const BertModel& model, Device& dev);

struct BertLoadReport {
  // Head tensors (pooler, classifier) the checkpoint does not have: they keep the values the model held
  // before the load (e.g. init_weights'), as transformers newly initialises them.
  std::vector<std::string> kept;
  // Tensors of the checkpoint that are not part of the model and were skipped (pre-training heads, buffers).
  std::vector<std::string> ignored;
};

// Loads the weights of the Hugging Face directory `dir` into the model's parameters (master weights and the
// compute-type copy). F32, F16 and BF16 tensors are accepted. A missing embedding or encoder tensor, a shape
// that disagrees with the model's config, or a tensor that belongs to no BERT part is an error naming the
// file, the tensor and the shapes.
BertLoadReport load_bert_weights(const std::string& dir, BertModel& model, Device& dev);

}  // namespace anvil::io
