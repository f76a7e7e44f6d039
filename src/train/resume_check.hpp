// A resume continues the run that saved the checkpoint: settings the checkpoint fixes cannot change, and a
// key the user sets explicitly (TrainConfig::origin: a config file or a flag) that contradicts it is an
// error rather than silently ignored.
#pragma once
#include <string>

#include "anvil/train_config.hpp"
#include "io/checkpoint.hpp"

namespace anvil {

// Compares the keys of `cfg` the user set explicitly with the checkpoint `checkpoint` being resumed:
//   - model: the shape (family, layers, heads, width, MLP width, context, activation; the vocabulary when
//     the given shape fixes it; BERT's segment vocabulary and, when the config fixes them, its labels)
//     against the checkpoint's config.json (`saved_model`);
//   - tokenizer: against the tokenizer file the checkpoint carries (none: the byte tokenizer), by content;
//   - freeze_parameters, given or not, against trainer_state.json's (the optimizer's state covers the
//     trainable tensors only);
//   - against the training config in trainer_state.json ("config", when present): init_from,
//     max_seq_length, seed, per_device_train_batch_size and gradient_accumulation_steps (their product
//     when auto_find_batch_size chose them), which fix the data order and position the resume continues.
// Other keys (max_steps, save_steps, logging_steps, eval_steps, output_dir, the learning-rate schedule,
// ...) may change on a resume. Throws anvil::Error naming the key, the given value, where it was set, and
// the checkpoint's value.
void check_resume_consistency(const TrainConfig& cfg, const std::string& checkpoint,
                              const TransformerConfig& saved_model, const io::TrainerState& state);

}  // namespace anvil
