// World size 1: every collective is the identity (or a copy from input to output).
#include "collectives/communicator_base.h"
#include "runtime/ops/ops.h"

namespace ddp {
namespace {

class LocalCommunicator : public CommunicatorBase {
 public:
  explicit LocalCommunicator(CommOptions options) : CommunicatorBase(0, 1, options) {}
  std::string backend() const override { return "local"; }
  bool accepts(const Device&) const override { return true; }

 protected:
  std::shared_ptr<Work> submit(Collective c) override {
    const bool observed = collective_observers_present();
    const CollectiveInfo info = observed ? info_of(c) : CollectiveInfo{};
    if (observed) notify_collective(info, CollectiveState::started);
    try {
      if (c.kind == CollectiveKind::all_gather || c.kind == CollectiveKind::reduce_scatter) {
        Tensor out = c.output.reshape(c.input.shape());
        copy_uncounted_(out, c.input);  // Note [version counter]
      }
    } catch (...) {
      if (observed) notify_collective(info, CollectiveState::failed);
      return completed_work(c.sequence, std::current_exception());
    }
    if (observed) notify_collective(info, CollectiveState::completed);
    return completed_work(c.sequence);
  }
};

}  // namespace

std::shared_ptr<Communicator> make_local_communicator(CommOptions options) {
  return std::make_shared<LocalCommunicator>(options);
}

}  // namespace ddp
