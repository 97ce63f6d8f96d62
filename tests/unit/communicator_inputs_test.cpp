// The communicator's inputs are const (collectives/communicator.h): a const
// tensor or a temporary can be sent (broadcast: by the root only). Checked at compile time (the
// requires expressions below do not compile where an input is a non-const Tensor&) and at run time
// on the local communicator; tests/multirank/shm_test.cpp sends them between real ranks.
#include "collectives/backends.h"
#include "collectives/communicator.h"
#include "runtime/ops/ops.h"
#include "tests/unit/error_text.h"

#include "ddp/config.h"

#include <gtest/gtest.h>

#include "runtime/fmt.h"

#include <chrono>
#include <string>
#include <utility>

namespace ddp {
namespace {

// Whether the collective compiles with a `T` argument (T = const Tensor&: a
// const tensor; T = Tensor: a temporary; T = Tensor&: a plain variable).
template <typename T>
concept Broadcasts = requires(Communicator& comm, T&& t) {
  comm.broadcast(std::forward<T>(t), 0);
};
template <typename T>
concept AllGathers = requires(Communicator& comm, T&& t, Tensor& out) {
  comm.all_gather(std::forward<T>(t), out);
};
template <typename T>
concept ReduceScatters = requires(Communicator& comm, T&& t, Tensor& out) {
  comm.reduce_scatter(std::forward<T>(t), out);
};
template <typename T>
concept AllReduces = requires(Communicator& comm, T&& t) {
  comm.all_reduce(std::forward<T>(t));
};

// Inputs: const tensors and temporaries can be sent. broadcast also takes a
// Tensor& (the overload that receives); its const overload compiles everywhere
// but is refused at run time off the root (Note [broadcast overloads];
// tests/multirank/shm_test.cpp).
static_assert(Broadcasts<Tensor&> && Broadcasts<const Tensor&> && Broadcasts<Tensor>);
static_assert(AllGathers<const Tensor&> && AllGathers<Tensor>);
static_assert(ReduceScatters<const Tensor&> && ReduceScatters<Tensor>);
// In place: what a collective writes stays a non-const reference, so a result
// cannot be dropped by passing a temporary.
static_assert(AllReduces<Tensor&> && !AllReduces<const Tensor&> && !AllReduces<Tensor>);

TEST(CommunicatorInputs, ConstAndTemporaryInputsAreSent) {
  auto comm = make_local_communicator();
  const Tensor root = from_vector<float>({1, 2, 3}, {3});
  comm->broadcast(root, 0)->wait();
  EXPECT_EQ(root.to_vector<float>(), (std::vector<float>{1, 2, 3}));

  Tensor gathered = zeros({3});
  comm->all_gather(from_vector<float>({4, 5, 6}, {3}), gathered)->wait();
  EXPECT_EQ(gathered.to_vector<float>(), (std::vector<float>{4, 5, 6}));

  Tensor scattered = zeros({2}, {.dtype = DType::i64});
  comm->reduce_scatter(arange(2, {.dtype = DType::i64}), scattered)->wait();
  EXPECT_EQ(scattered.to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
}

// A timeout below 1 ms is named before any rank connects (gloo's own check threw an
// exception of its own type, shm waited 0 s and blamed the other ranks).
TEST(CommunicatorInputs, ATimeoutBelowOneMillisecondIsNamed) {
  for (const auto ms : {0, -1000}) {
    const CommOptions comm{.timeout = std::chrono::milliseconds(ms)};
    ShmOptions shm;
    shm.run_id = "timeout-check";
    shm.comm = comm;
    std::string msg = test_util::value_error([&] { make_shm_communicator(shm); });
    EXPECT_NE(msg.find(fmt::format("shm backend: CommOptions.timeout is {} ms; give every "
                                   "collective at least 1 ms",
                                   ms)),
              std::string::npos)
        << msg;
#if DDP_HAVE_GLOO
    GlooOptions gloo;
    gloo.comm = comm;
    msg = test_util::value_error([&] { make_gloo_communicator(nullptr, gloo); });
    EXPECT_NE(msg.find(fmt::format("gloo backend: CommOptions.timeout is {} ms", ms)),
              std::string::npos)
        << msg;
#endif
    msg = test_util::value_error([&] { make_local_communicator(comm); });
    EXPECT_NE(msg.find(fmt::format("communicator: CommOptions.timeout is {} ms", ms)),
              std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace ddp
