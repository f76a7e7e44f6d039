#include "train/zero_checkpoint.hpp"

#include <filesystem>
#include <optional>
#include <vector>

#include "io/atomic_dir.hpp"
#include "io/checkpoint.hpp"
#include "io/quantized_base.hpp"

namespace anvil {
namespace fs = std::filesystem;

io::StateSlices zero_state_slices(const Optimizer& mine, const dist::ZeroPartition& p, int rank) {
  io::StateSlices slices;
  for (int q = 0; q < p.world(); ++q) {
    const std::unique_ptr<Optimizer> o = make_optimizer(mine.kind(), mine.layout(), mine.hyper(), p.shard(q));
    for (const OptimizerStateTensor& t : o->state_tensors()) {
      io::StateSlice& s = slices[t.name];
      if (q < rank) s.offset += t.count;
      s.total += t.count;
    }
  }
  return slices;
}

void save_zero_checkpoint(const std::string& dir, Engine& e, dist::ProcessGroup& group,
                          const io::StateSlices& slices, const nlohmann::json& state,
                          const std::string& tokenizer_file, const io::BaseReference* base) {
  dist::Communicator& comm = group.comm();
  const int rank = comm.rank(), world = comm.world_size();
  std::optional<io::AtomicDirectory> out;
  std::string temp;
  if (rank == 0) {
    out.emplace(dir);
    temp = out->path();
    fs::create_directories(fs::path(temp) / "zero");
  }
  temp = group.exchange("checkpoint " + dir, temp)[0];
  // The model files. Gathering the master weights is a collective, so the other ranks take part too (without
  // host memory for the model).
  // (A QLoRA base: every rank holds the same codes.)
  if (rank == 0)
    io::save_checkpoint_model(temp, e.model(), e.device(), base);
  else
    io::join_checkpoint_model(e.model(), e.device(), base);
  io::save_optimizer_shard(io::optimizer_shard_path(temp, rank, world), e.optimizer_state(false),
                           e.optimizer_device(), slices, rank, world);
  comm.barrier();  // every rank's file is written and synced before the directory appears
  if (rank != 0) return;
  io::write_text_file_synced(out->file("trainer_state.json"), state.dump(2) + "\n");
  for (const auto& [source, name] : io::tokenizer_side_files(tokenizer_file))
    io::write_text_file_synced(out->file(name), io::read_text_file(source));
  out->commit();
}

}  // namespace anvil
