// make_nccl_communicator for builds without CUDA: it says so clearly instead of failing to link.
#ifndef ANVIL_WITH_CUDA
#include "anvil/error.hpp"
#include "dist/communicator.hpp"

namespace anvil::dist {

std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv&, Device&, Store&,
                                                     std::chrono::milliseconds) {
  ANVIL_THROW(
      "this Anvil was built without CUDA, so it cannot train on several GPUs (configure with a CUDA "
      "toolkit and NCCL)");
}

}  // namespace anvil::dist
#endif
