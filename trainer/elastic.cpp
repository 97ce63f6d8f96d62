#include "trainer/elastic.h"

#include "collectives/collective_events.h"
#include "collectives/elastic.h"
#include "runtime/autograd/functions.h"
#include "runtime/env.h"
#include "runtime/ops/ops.h"

#include <unistd.h>

#include "runtime/fmt.h"

#include <signal.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

// How long a rank whose collective failed waits for ddprun's next membership and
// for the other members. ddprun sees a death at once and a stopped or hung rank
// at its timeout, after which the peers' collectives fail; so this bounds only a
// failure that was not a departure (then the original error ends the run).
constexpr std::chrono::milliseconds kRegroupTimeout{30000};

// The progress a rank announces: 4 x steps, + the step's reports done (1: its
// --eval-every evaluation, 2: its --save-every checkpoint too), 3 once the
// epoch's report is done (the position is the next epoch's start), so the most
// advanced rank is the one with the highest value.
int64_t progress(const Run& r) {
  const bool reported = r.position.step == 0 && r.position.epoch > 0;
  return 4 * r.step + (reported ? 3 : r.position.reports);
}

// Every tensor of `mine` (the source's; the others' are replaced) from rank
// `source`: names, dtypes and shapes first, so a rank whose optimizer has not
// made its state yet receives it whole. The state's collectives here end in
// synchronize(), not wait(): on nccl wait() only orders the streams and neither
// blocks nor throws, and what arrived must be there (or its failure known, a
// CommError that regroups again) before it is read or committed (Note [nccl
// regroup]).
nn::NamedTensors broadcast_named(Communicator& comm, const nn::NamedTensors& mine, int source,
                                 const Device& device) {
  const bool root = comm.rank() == source;
  std::string header;
  if (root) {
    for (const auto& [name, t] : mine) {
      header += fmt::format("{}\t{}\t{}\n", name, dtype_name(t.dtype()), fmt::join(t.shape(), ","));
    }
  }
  Tensor length = from_vector<int64_t>({static_cast<int64_t>(header.size())}, {1},
                                       {.dtype = DType::i64, .device = device});
  comm.broadcast(length, source)->synchronize();
  const int64_t n = length.to_vector<int64_t>()[0];
  std::vector<uint8_t> bytes(header.begin(), header.end());
  bytes.resize(static_cast<size_t>(n));
  Tensor text = from_vector<uint8_t>(bytes, {n}, {.dtype = DType::u8, .device = device});
  if (n > 0) comm.broadcast(text, source)->synchronize();
  nn::NamedTensors out = root ? mine : nn::NamedTensors{};
  if (!root) {
    const auto got = text.to_vector<uint8_t>();
    std::istringstream lines(std::string(got.begin(), got.end()));
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string name, dtype, dims;
      std::getline(fields, name, '\t');
      std::getline(fields, dtype, '\t');
      std::getline(fields, dims);
      Shape shape;
      std::istringstream parts(dims);
      for (std::string d; std::getline(parts, d, ',');) shape.push_back(std::stoll(d));
      out.emplace_back(name, zeros(shape, {.dtype = parse_dtype(dtype), .device = device}));
    }
  }
  for (auto& [name, t] : out) comm.broadcast(t, source)->synchronize();
  return out;
}

// Note [elastic training] 3: the source's model, optimizer and counters everywhere.
// Everything is received first and committed at the end, so a copy that fails
// half-way (another rank left meanwhile) leaves this rank's state as it was.
// What recover_zero() put together, and from which optimizer.
struct ZeroRegroup {
  std::unique_ptr<ZeroOptimizer> optimizer;  // over the new group, its shards loaded
  std::vector<Tensor> parameters;            // the values, in the optimizer's order
  int64_t generation = 0;                    // of the new group's optimizer
  bool from_previous = false;                // read from r.previous_optimizer, not r.zero
};

// Note [zero generations]
// A regroup under ZeRO (--zero-replicas 2) replaces each rank's ZeroOptimizer by
// one over the new group, at the end of copy_state(); collectives follow (DDP's
// constructor), so a rank leaving then makes some ranks try the regroup again
// with the new group's optimizer and others with the old one. Each optimizer has
// a generation (the regroups that made it); the previous one is kept until the
// new one updates, which needs every rank of the new group to have it. The next
// regroup takes the lowest generation among its ranks: a rank ahead passes its
// previous optimizer (recover() undoes what it changed there, Note [zero
// replicas]), so every rank reads shards of one group and of one state.
// The optimizer steps the group goes on from are the source's (its step
// counters less the skipped steps): a step whose all-gather failed counts when
// its rank counted it (epoch.cpp), and then every rank entered its commit.
ZeroRegroup recover_zero(Run& r, int source) {
  Communicator& comm = *r.pg->comm;
  const Device device = comm.device();
  const int64_t mine = r.zero != nullptr ? r.zero_generation : -1;  // -1: a replacement
  const Tensor sent = from_vector<int64_t>({mine, r.step - r.nonfinite->skipped()}, {2},
                                           {.dtype = DType::i64, .device = device});
  Tensor all = empty({2 * comm.size()}, {.dtype = DType::i64, .device = device});
  comm.all_gather(sent, all)->synchronize();
  const auto info = all.to_vector<int64_t>();
  int64_t lowest = -1;
  for (int q = 0; q < comm.size(); ++q) {
    const int64_t g = info[static_cast<size_t>(2 * q)];
    if (g >= 0 && (lowest < 0 || g < lowest)) lowest = g;
  }
  ZeroRegroup out;
  ZeroOptimizer* old = r.zero;
  if (mine > lowest) {
    DDP_CHECK(mine == lowest + 1 && r.has_previous_optimizer,
              "regroup under ZeRO: this rank's optimizer is of generation {}, the group's lowest "
              "{}, and it kept no earlier one (Note [zero generations])",
              mine, lowest);
    old = dynamic_cast<ZeroOptimizer*>(r.previous_optimizer.get());  // null: a replacement
    out.from_previous = true;
  }
  const int64_t steps = info[static_cast<size_t>(2 * source + 1)];
  out.optimizer = make_zero(r, r.task->make_optimizer(r.o), r.pg->comm);
  out.parameters = ZeroOptimizer::recover(comm, old, *out.optimizer, steps);
  out.generation = lowest + 1;
  return out;
}

// ZeRO (`zero`: what the ranks' shards and replicas gave, Note [zero replicas]):
// the optimizer and the parameters come from there, over the new group, so only
// the model's other tensors (buffers, parameters the optimizer does not update)
// are sent.
void copy_state(Run& r, int source, ZeroRegroup* zero) {
  Communicator& comm = *r.pg->comm;
  const CollectiveLabel labelled("elastic state");
  const NoGradGuard no_grad;
  const bool root = comm.rank() == source;
  nn::NamedTensors model_state = r.model->state_dict();
  if (zero != nullptr) {
    std::set<const void*> recovered;
    for (const Tensor& p : zero->optimizer->params()) recovered.insert(p.data_ptr());
    std::erase_if(model_state, [&](const auto& e) {
      return e.second.numel() > 0 && recovered.contains(e.second.data_ptr());
    });
  }
  std::vector<Tensor> received;
  for (auto& [name, t] : model_state) {
    Tensor buffer = root ? t : t.clone();
    comm.broadcast(buffer, source)->synchronize();
    received.push_back(buffer);
  }
  const nn::NamedTensors state =
      zero != nullptr ? nn::NamedTensors{}
                      : broadcast_named(comm, r.optimizer->state(), source, comm.device());
  const EpochPosition& p = r.position;
  // A report the source did not complete is taken again: the best so far as it
  // found it (Note [reports committed] in epoch.cpp).
  const Run::BestSoFar best =
      r.report_in_flight.value_or(Run::BestSoFar{r.best_metric, r.evals_since_best, r.stop_early});
  Tensor counters = from_vector<int64_t>(
      {r.step, r.optimizer->steps(), p.epoch, p.step, p.cursor, p.micro_batches,
       r.nonfinite->skipped(), best.evals_since_best, std::bit_cast<int64_t>(best.best_metric),
       std::bit_cast<int64_t>(r.grad_norm), best.stop_early ? 1 : 0, p.reports,
       r.report_in_flight ? 1 : 0},
      {13}, {.dtype = DType::i64, .device = comm.device()});
  const float last = r.last_loss.defined() ? r.last_loss.item<float>() : 0.0f;
  const float sum = p.loss_sum.defined() ? p.loss_sum.item<float>() : 0.0f;
  Tensor values = from_vector<float>({sum, last}, {2}, {.device = comm.device()});
  comm.broadcast(counters, source)->synchronize();
  comm.broadcast(values, source)->synchronize();
  // Commit.
  const auto c = counters.to_vector<int64_t>();
  const auto v = values.to_vector<float>();
  if (!root) {
    for (size_t i = 0; i < model_state.size(); ++i) copy_(model_state[i].second, received[i]);
    if (zero == nullptr) r.optimizer->load_state(state, c[1]);
  }
  if (zero != nullptr) {
    std::vector<Tensor> params = zero->optimizer->params();  // the live tensors, its order
    for (size_t i = 0; i < params.size(); ++i) copy_(params[i], zero->parameters[i]);
    std::unique_ptr<ZeroOptimizer> sharded = std::move(zero->optimizer);
    // Note [zero generations]: the optimizer recover() read is kept until this one updates.
    if (!zero->from_previous) {
      r.previous_optimizer = r.zero != nullptr ? std::move(r.optimizer) : nullptr;
    }
    r.has_previous_optimizer = true;
    r.zero_generation = zero->generation;
    r.zero = sharded.get();
    r.optimizer = std::move(sharded);
  }
  r.step = c[0];
  r.position = EpochPosition{.epoch = c[2],
                             .step = c[3],
                             .cursor = c[4],
                             .loss_sum_value = v[0],
                             .micro_batches = c[5],
                             .reports = c[11]};
  r.last_loss = from_vector<float>({v[1]}, {}, {.device = r.device});
  r.evals_since_best = c[7];
  r.best_metric = std::bit_cast<double>(c[8]);
  r.grad_norm = std::bit_cast<double>(c[9]);
  r.stop_early = c[10] != 0;
  // Still inside the report the group takes again, should another rank leave
  // before it does (Note [reports committed]).
  r.report_in_flight.reset();
  if (c[12] != 0)
    r.report_in_flight = Run::BestSoFar{r.best_metric, r.evals_since_best, r.stop_early};
  // The report the group takes again: one the source was inside, or the
  // --eval-every evaluation of a step whose reports it had not begun (the
  // writer may have written that row before the others failed inside it). Its
  // step's rows of reports completed before it stay: an --eval-every row that
  // decided --early-stop, when the epoch's report ends the epoch at that step.
  r.report_again_at = c[12] != 0 || (c[3] > 0 && c[11] < 1) ? r.step : -1;
  r.report_rows_kept = c[12] != 0 && r.stop_early ? 1 : 0;
  r.nonfinite =
      std::make_unique<NonfiniteCheck>(r.o.on_nonfinite, r.device, &comm, comm.rank(), c[6]);
}

// The last "epoch step" row of a --loss-log file ({0, 0}: none).
std::pair<int64_t, int64_t> last_loss_row(const std::string& path) {
  std::ifstream in(path);
  std::pair<int64_t, int64_t> last{0, 0};
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    int64_t epoch = 0, step = 0;
    if (fields >> epoch >> step) last = {epoch, step};
  }
  return last;
}

// The writer's files (Note [elastic training]): launch rank 0 gone, the new rank 0
// opens them cut back to the position; either way the loss row of the position's
// step is written when the writer never finished that step itself.
void take_over_writing(Run& r, bool new_writer) {
  const EpochPosition& p = r.position;
  if (new_writer) {
    *r.writable = *r.launch_options;
    r.writable->save_everywhere = r.launch_options->save;
    const RunPosition start{r.step, p.epoch, p.step};
    r.metrics = std::make_unique<MetricsLog>(r.o.metrics, start);
    r.loss_log = std::make_unique<LossLog>(r.o.loss_log, start);
    r.loss_log->set_flush_each_row(true);
  }
  // The report the group takes again wrote its row once already, perhaps.
  if (r.report_again_at >= 0) {
    r.metrics->drop_evaluations_at(r.report_again_at, r.report_rows_kept);
  }
  if (r.o.loss_log.empty() || p.step == 0) return;
  r.loss_log->flush();
  if (last_loss_row(r.o.loss_log) < std::pair<int64_t, int64_t>{p.epoch + 1, p.step}) {
    r.loss_log->step(p.epoch + 1, p.step, r.last_loss, r.o.grad_accum);
    r.loss_log->flush();
  }
}

}  // namespace

void check_elastic(const Run& r) {
  const TrainOptions& o = r.o;
  const std::string backend = r.pg->backend;
  DDP_CHECK(backend == "shm" || backend == "gloo" || backend == "nccl",
            "--on-failure continue (ddprun): the {} backend cannot regroup the ranks left; use "
            "--backend shm, gloo or nccl, or ddprun --on-failure restart",
            backend);
  DDP_CHECK(o.zero == 0 || (o.zero <= 2 && o.zero_replicas == 2),
            "--zero {}{} under ddprun --on-failure continue: a rank's optimizer shard dies with "
            "it, so the ranks left could not go on; {}, or ddprun --on-failure restart (the "
            "group restarts from the last checkpoint)",
            o.zero, o.zero <= 2 ? " without --zero-replicas 2" : "",
            o.zero <= 2 ? "add --zero-replicas 2 (each shard kept by two ranks), use --zero 0"
                        : "use --zero 1 or 2 with --zero-replicas 2, or --zero 0");
  DDP_CHECK(o.drop_last != DropLast::uneven,
            "--drop-last false under ddprun --on-failure continue: its uneven epochs run under a "
            "Join, which a regroup cannot carry on; use --drop-last pad or true");
  DDP_CHECK(r.task->reshardable(),
            "ddprun --on-failure continue: the task of {} cannot share its data out again among "
            "the ranks left; use ddprun --on-failure restart",
            r.task->model_spec());
  if (r.loss_log) r.loss_log->set_flush_each_row(true);
}

EpochSteps rest_of_epoch(const Task& task, const TrainOptions& o, int rank, int world_size,
                         int64_t done) {
  std::vector<int64_t> batches;
  for (int q = 0; q < world_size; ++q) batches.push_back(task.num_batches_of(q));
  const bool capped = o.max_steps > 0 && done >= o.max_steps;
  if (capped || batches.front() < o.grad_accum) {  // rank 0 has the most
    return EpochSteps{.steps = 0, .mine = 0, .of_rank = std::vector<int64_t>(batches.size(), 0)};
  }
  return epoch_steps(batches, o.batch_size, o.grad_accum, o.max_steps > 0 ? o.max_steps - done : 0,
                     rank);
}

// Note [schedule span after a regroup]: a schedule's span is counted in the steps
// planned at the start (Note [schedule span]); a smaller group takes more steps
// for the same samples, and those past the span run at the schedule's floor
// (min_lr: 0 for the mlp's cosine). Not rescaled (every member, a replacement
// too, would have to agree on the rescaling's history): said once per regroup,
// with the numbers, so that it is never silent. A larger group ends early, above
// the floor.
void note_schedule_span(Run& r, int64_t epoch, int64_t rest_of_this_epoch) {
  const int64_t full = std::exchange(r.regroup_full_epoch_steps, -1);
  if (full < 0 || r.schedule.kind == optim::LrSchedule::Kind::constant) return;
  const int64_t left = rest_of_this_epoch + std::max<int64_t>(r.o.epochs - epoch - 1, 0) * full;
  const int64_t planned = r.schedule.total_steps - r.optimizer->steps();
  if (left == planned || r.schedule.kind == optim::LrSchedule::Kind::step) return;
  r.out << fmt::format(
      "note: --lr-schedule {} was planned for {} steps at the start; at {} rank{} the run has "
      "{} steps left where the schedule has {}: {}\n",
      r.o.lr_schedule, r.schedule.total_steps, r.world_size, r.world_size == 1 ? "" : "s", left,
      std::max<int64_t>(planned, 0),
      left > planned ? fmt::format("its last {} run at the schedule's end (lr {:g})",
                                   left - std::max<int64_t>(planned, 0), r.schedule.min_lr)
                     : "it ends before the schedule does");
}

namespace {

// After a regroup: the most advanced rank's state here, the data resharded,
// DDP rebuilt, the writer's files taken over (Note [elastic training] 3, 4).
void go_on(Run& r, const Regroup& g, int old_rank, Clock::time_point start) {
  ProcessGroup& pg = *r.pg;
  r.world_size = pg.env.world_size;
  // ZeRO: the shards and replicas the ranks left hold (a replacement: none).
  std::optional<ZeroRegroup> zero;
  if (r.o.zero > 0) zero = recover_zero(r, g.source);
  copy_state(r, g.source, zero ? &*zero : nullptr);
  r.task->reshard(pg.env.rank, pg.env.world_size);
  // For note_schedule_span(): a whole epoch at the new size (the sampler starts anew).
  if (pg.env.rank == 0)
    r.regroup_full_epoch_steps = epoch_steps(*r.task, r.o, 0, r.world_size).steps;
  make_ddp(r);
  if (pg.env.rank == 0) take_over_writing(r, old_rank != 0);
  r.rejoin_at = r.position;
  // Note [group stop]: train_epoch stops at its next step (a replacement taken
  // into the group's last membership too).
  r.group_stop = g.stop;
  r.next_membership_poll = Clock::now() + kMembershipPoll;
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  r.metrics->write_membership(r.step, r.position.epoch + 1, g.epoch, g.members, g.left, g.joined,
                              seconds);
  r.out << fmt::format(
      "rank {}: membership {} is ranks {} (launch ranks); this rank is now rank {} of {}; going "
      "on from step {} (epoch {}, step {} of it), copied from launch rank {}; regrouped in "
      "{:.2f} s\n",
      pg.launch_rank, g.epoch, elastic::format_members(g.members), pg.env.rank, pg.env.world_size,
      r.step, r.position.epoch + 1, r.position.step, g.members[g.source], seconds);
  r.out.flush();
}

}  // namespace

// How long a rank whose collective failed waits for the next membership. ddprun
// removes a dead rank at once, but a hung one only when its hang detector fires:
// --hang-timeout after the last progress (DDPRUN_HANG_TIMEOUT_S; by default the
// collective timeout + 60 s, Note [default hang timeout]), that is, that much
// after the ranks' own collectives time out. A timed-out rank waits that margin too.
std::chrono::milliseconds regroup_wait(const Run& r, const CommError& failure) {
  if (dynamic_cast<const CommTimeoutError*>(&failure) == nullptr) return kRegroupTimeout;
  const double timeout_s = std::chrono::duration<double>(r.pg->comm_options.timeout).count();
  const double hang_s = env::get_double(env::kHangTimeoutS).value_or(timeout_s + 60);
  // No detector (0), or a value past ddprun's own bound for --hang-timeout (a hand-set
  // variable; inf): a hung rank is never removed, and the cast below would overflow.
  if (!(hang_s > 0) || hang_s > 1e9) return kRegroupTimeout;
  return kRegroupTimeout +
         std::chrono::milliseconds(static_cast<int64_t>(1000 * std::max(0.0, hang_s - timeout_s)));
}

void rejoin(Run& r, const CommError& failure) {
  ProcessGroup& pg = *r.pg;
  const int old_rank = pg.env.rank;
  const auto wait = regroup_wait(r, failure);
  std::string cause = failure.what();
  r.out << fmt::format("{}; regrouping (--on-failure continue)\n", cause);
  r.out.flush();
  for (;;) {  // again when another rank leaves during the regroup
    const auto start = Clock::now();
    r.join.reset();
    r.ddp.reset();
    if (r.zero != nullptr) r.zero->leave_group();  // its shards stay, for the regroup
    pg.comm.reset();                               // Note [elastic training] 1
    try {
      const Regroup g = regroup(pg, progress(r), wait, cause);
      go_on(r, g, old_rank, start);
      // DDP_TEST_KILL_AT at the step DDP_TEST_JOIN_AT takes a replacement in: after the
      // join (after_step in epoch.cpp), so a test's schedule does not race.
      if (r.step == r.faults.kill_step && r.step == r.join_at_step) ::raise(SIGKILL);
      return;
    } catch (const CommError& again) {
      if (again.op() == "regroup") throw;  // no membership to go on with
      cause = again.what();
      r.out << fmt::format("{}; regrouping again\n", cause);
      r.out.flush();
    }
  }
}

bool join_group(Run& r) {
  ProcessGroup& pg = *r.pg;
  // A membership that takes this replacement in comes after its request: one
  // before it that lists its launch rank is a predecessor's (a rank replaced
  // twice), which regroup() must not try to form again.
  pg.membership = elastic::latest_epoch(*pg.store);
  pg.store->set(elastic::join_key(pg.launch_rank), std::to_string(::getpid()));
  r.out << fmt::format(
      "rank {}: a replacement (DDPRUN_REPLACEMENT={}), ready; joining the group at its next step "
      "boundary\n",
      pg.launch_rank, env::get(env::kReplacement).value_or("?"));
  r.out.flush();
  for (;;) {  // again when a member leaves while it joins
    const auto start = Clock::now();
    r.ddp.reset();  // as rejoin(): nothing may keep the communicator
    if (r.zero != nullptr) r.zero->leave_group();
    pg.comm.reset();
    try {
      const Regroup g = regroup(pg, -1, pg.comm_options.timeout, "a replacement asked to join",
                                /*joining=*/true);
      if (g.finished) {
        r.out << fmt::format(
            "rank {}: the group finished before this replacement joined; nothing to do\n",
            pg.launch_rank);
        return false;
      }
      go_on(r, g, /*old_rank=*/-1, start);
      pg.env.joining = false;
      return true;
    } catch (const CommError& again) {
      if (again.op() == "regroup") throw;
      r.out << fmt::format("{}; joining again\n", again.what());
      r.out.flush();
    }
  }
}

void mark_done(Run& r) {
  if (r.elastic) r.pg->store->set(elastic::kDoneKey, std::string("1"));
}

void check_membership(Run& r) {
  if (!r.elastic) return;
  ProcessGroup& pg = *r.pg;
  const bool test_step = r.join_at_step > 0;  // DDP_TEST_JOIN_AT: only there, and waiting
  if (test_step ? r.step != r.join_at_step : Clock::now() < r.next_membership_poll) return;
  r.next_membership_poll = Clock::now() + kMembershipPoll;
  const auto deadline = Clock::now() + kRegroupTimeout;
  int64_t latest = elastic::latest_epoch(*pg.store);
  while (test_step && latest <= pg.membership && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    latest = elastic::latest_epoch(*pg.store);
  }
  if (latest <= pg.membership) return;
  throw CommError(fmt::format("rank {}: membership {} announced at step {} (a rank joins or left)",
                              pg.env.rank, latest, r.step),
                  pg.env.rank, "membership", -1, 0);
}

}  // namespace ddp::train
