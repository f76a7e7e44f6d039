// The communicator of a one-rank job: every collective's result is this rank's own data, so reductions and
// broadcasts leave the buffer as it is and the gathers are copies on the device's compute stream (ordered
// like any other compute work, which is what the header promises of a collective).
#include "anvil/error.hpp"
#include "dist/communicator.hpp"
#include "runtime/device.hpp"

namespace anvil::dist {
namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  explicit SingleProcessCommunicator(Device& dev) : dev_(dev) {}

  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  const char* backend() const override { return "single process"; }

  void all_reduce(void*, size_t, DType, ReduceOp) override {}
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp) override {
    copy(send, recv, recv_count, dtype);
  }
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    copy(send, recv, send_count, dtype);
  }
  void reduce_scatter_v(void*, const std::vector<size_t>&, DType, ReduceOp) override {}
  void all_gather_v(void*, const std::vector<size_t>&, DType) override {}
  void broadcast(void*, size_t, DType, int root) override {
    ANVIL_REQUIRE(root == 0, "broadcast from root {} in a job of one rank: the root must be 0", root);
  }
  void all_to_all(const void* send, void* recv, size_t count_per_rank, DType dtype) override {
    copy(send, recv, count_per_rank, dtype);
  }
  void join() override {}
  void all_reduce_host(double*, size_t) override {}
  void barrier() override {}

 private:
  void copy(const void* send, void* recv, size_t count, DType dtype) {
    if (send != recv && count) dev_.copy_on_device(recv, send, dtype_bytes(dtype, count));
  }

  Device& dev_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator(Device& dev) {
  return std::make_unique<SingleProcessCommunicator>(dev);
}

}  // namespace anvil::dist
