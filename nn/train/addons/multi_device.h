// MultiDevice: the seed's MultiGPUAddon. One training process per device, data-parallel through
// DistributedDataParallel, from an unchanged single-process program.
//
//   Python (the seed)                                     C++ (tinyddp)
//   ----------------------------------------------------  ---------------------------------------------------
//   trainer = Trainer.add_on(MultiGPUAddon)(              using MyTrainer = nn::WithAddOns<DummyTrainer,
//   nn::MultiDevice>;
//       model=model, device=['cuda:0', 'cuda:1'], ...,    MyTrainer trainer(model, nn::all_devices(2), opt, &sched);
//       init_method='tcp://localhost:12355')              trainer.set_init_method("tcp://localhost:12355");
//   trainer.run(n_epoch=10, loader=loader)                trainer.run(10, loader);
//   torch.save(trainer.model.state_dict(), 'm.pt')        if (trainer.is_main_process())
//   nn::save_model("m.safetensors", trainer.model());
//
// What run() does depends on who is calling it:
//
//   the program as the user started it, with several devices (the "spawner"):
//     it hosts the job's store (on init_method's port, or a free one when that is taken), then starts
//     one worker per device by running this same program again with the same arguments, plus RANK,
//     WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and a job token in the environment (what
//     torch.multiprocessing.spawn does with the "spawn" start method). It waits for them; when one
//     fails, the others are stopped and run() throws an error naming the rank and how it ended.
//     When they succeed, rank 0 has left its final state behind, and the spawner loads it: after
//     run() this process holds rank 0's final weights (and optimizer, scheduler, history, best
//     weights and the trainer's own get_extra_state), so the seed's "save the model after run" works
//     unchanged, and world_size() says how many ranks the job had.
//
//   a spawned worker (it finds those variables): it joins the job (rendezvous, a process group:
//     NCCL for CUDA devices when built, the ring otherwise), moves the model to devices[LOCAL_RANK],
//     wraps it in DistributedDataParallel, gives each loader a DistributedSampler so each rank
//     trains on its own share, and runs the ordinary training loop. Only rank 0 draws the progress
//     bar and writes checkpoints.
//
//   a process started by a launcher (tinyddp-run, torchrun, srun, mpirun set RANK/WORLD_SIZE or their
//     own variables): it joins directly, exactly as a spawned worker, without spawning anything.
//
//   a program with one device and no launcher: the plain single-process loop.
//
// Because every worker runs the whole program again, code after run() runs in every worker too. Guard
// what only one process should do -- print results, save files -- with is_main_process(), true in
// exactly one process of the job: the spawner, or rank 0 under a launcher. (Python needs the same
// care: `if __name__ == "__main__":` is what keeps mp.spawn's children from re-running the script.)
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/nn/ddp/distributed_data_parallel.h"
#include "tinyddp/nn/optim/zero_redundancy_optimizer.h"
#include "tinyddp/nn/train/addons/spawned_workers.h"
#include "tinyddp/nn/train/trainer.h"

namespace tinyddp::nn {

struct MultiDeviceOptions {
  // Where the job's store listens: the seed's default.
  std::string init_method = "tcp://localhost:12355";
  // When init_method's port is taken: true, use a free port instead (right for a default nobody
  // chose); false, fail naming the process that holds it (right for a port the user asked for, which
  // something else -- a firewall rule, a second job's address -- may count on). The examples set it
  // false when --init-method is given.
  bool port_may_move = true;
  // How a process started by a launcher joins: env:// (the launcher's variables), or tcp://host:port
  // (rank 0 hosts the store there; ranks and world size still from the launcher).
  std::string launched_init_method = "env://";
  // "host" or "nccl"; empty: nccl for CUDA devices when this build has it, host otherwise.
  std::string backend;
  DdpOptions ddp;
  // ZeRO stage: 0 (plain DDP: every rank holds the whole optimizer state) or 1 (each worker steps a
  // ZeroRedundancyOptimizer with the given optimizer's settings and lr, holding 1/N of the state;
  // nn/optim/zero_redundancy_optimizer.h). Checkpoints then carry the consolidated state, which the
  // given optimizer loads.
  int zero_stage = 0;
  // How each gradient bucket is reduced (nn/ddp/comm_hook.h, comm_hooks::names()): "" or "allreduce"
  // (f32, the default), "bf16_compress", "fp16_compress", "bf16_single_rounding". ZeRO-1 brings its
  // own comm hook, so it takes only the default.
  std::string comm_hook;
  // The spawner's limit for the whole job (zero: none). Past it, the workers are stopped and run() throws.
  std::chrono::milliseconds timeout{0};
  // Between SIGTERM and SIGKILL when workers are stopped.
  std::chrono::milliseconds grace = std::chrono::seconds(5);
  // Start each spawned worker on its own share of this process's CPUs, as tinyddp-run's --cpu-bind auto
  // does (nothing is bound when the workers outnumber the CPUs, nor under TINYDDP_BIND=none).
  bool bind_cpus = true;
  // How a worker is started; empty: this program with this process's own arguments (this_program_command()).
  std::vector<std::string> worker_command;
};

// Which part this process plays in a MultiDevice run (see the header comment).
enum class ProcessRole { single, spawner, spawned_worker, launched_worker };
ProcessRole detect_process_role(size_t device_count);
const char* process_role_name(ProcessRole role);

// Every visible GPU (cuda:0 ... cuda:N-1) or, on a machine without one, `cpu_workers` CPU devices:
// the seed's "all GPUs of the machine, or N CPU workers where there is none".
std::vector<Device> all_devices(int cpu_workers = 2);

// This program's path (/proc/self/exe) followed by this process's arguments (/proc/self/cmdline).
std::vector<std::string> this_program_command();

// ---- the non-template parts of MultiDevice (nn/train/addons/multi_device.cpp) ----
namespace multi_device {

// What a worker learns when it joins its job.
struct JoinedJob {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  Device device;
  std::shared_ptr<comm::ProcessGroup> group;
  std::string result_dir;                  // spawned workers: where rank 0 leaves its final state for the spawner
  std::shared_ptr<comm::TcpStore> store;   // the job's store, unscoped
  std::shared_ptr<comm::Store> job_store;  // the same, scoped to this job (rendezvous' namespace)
};

// This process's rank as its launcher set it (RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK); -1 when none did.
int launched_rank();
// Rendezvous from the environment and a process group of the chosen backend; picks this rank's device.
JoinedJob join_job(const std::vector<Device>& devices, const MultiDeviceOptions& options);
// Returns once every rank has finished its collectives, so that none exits while a peer may still be
// reading the last collective's data from it. It meets through the store, not the process group:
// a barrier over the group is itself a collective some rank finishes first.
void leave_job(const JoinedJob& job);
// A spawned worker whose run() throws tells the spawner why, with the time, through the store, so the
// spawner can name the rank that failed first (the others then fail because it is gone) and quote
// its message and hint (`problem` and `advice`, as an Error holds them). Under torchrun it writes
// TORCHELASTIC_ERROR_FILE (comm/launch/failure_report.h). Once the spawner has the message, the
// worker's stderr goes to /dev/null: the spawner prints the root cause once, with each rank's line
// after it, instead of every rank printing its own.
void report_failure(const JoinedJob& job, const std::string& problem, const std::string& advice);
// Refuses a zero_stage other than 0 or 1.
void check_zero_options(const MultiDeviceOptions& options, const TrainerOptions& trainer);
// Refuses a comm hook name that is not a built-in one, and a compressing hook with ZeRO-1.
void check_comm_hook(const MultiDeviceOptions& options);
// Runs one worker per device and waits for them; throws naming the rank that failed. Returns the
// directory holding rank 0's final state (removed by the returned handle's destructor).
std::shared_ptr<const std::string> spawn_workers(const std::vector<Device>& devices, const MultiDeviceOptions& options);
// A loader over the same dataset whose sampler hands this rank its share (DistributedSampler with
// the loader's shuffle and seed), or nullptr when the loader already has a DistributedSampler (it is
// used as it is).
std::unique_ptr<DataLoader> shard_loader(DataLoader& loader, int rank, int world_size);
// The batches per epoch each rank's share of `loader` has (every rank the same: the sampler pads).
int64_t batches_per_rank(DataLoader& loader, int world_size);
// Rank 0 of a spawned job leaves its state in `dir`; the spawner reads it back into its own trainer.
void save_result(const std::string& dir, Trainer& trainer);
void load_result(const std::string& dir, Trainer& trainer);
// Element-wise sum of `values` over the group.
void all_reduce_sum(comm::ProcessGroup& group, Device device, std::vector<double>& values);

}  // namespace multi_device

template <class Base>
class MultiDevice : public Base {
  static_assert(std::is_base_of_v<Trainer, Base>, "MultiDevice<Base>: Base must derive from nn::Trainer");

 public:
  using Base::Base;

  // The seed's init_method argument.
  void set_init_method(std::string init_method) { options_.init_method = std::move(init_method); }
  MultiDeviceOptions& multi_device_options() { return options_; }

  ProcessRole role() const { return detect_process_role(this->devices().size()); }
  bool is_main_process() const override {
    switch (role()) {
      case ProcessRole::single:
      case ProcessRole::spawner: return true;
      case ProcessRole::spawned_worker: return false;  // the spawner reports for the job
      case ProcessRole::launched_worker: return multi_device::launched_rank() == 0;
    }
    return true;
  }
  // The DDP wrapper while a worker trains (nullptr otherwise).
  DistributedDataParallel* ddp() { return ddp_.get(); }

  void run(int64_t n_epoch, DataLoader& loader, DataLoader* valid_loader = nullptr) override {
    // An exception that nobody catches ends in std::terminate, which unwinds no frame. This handler
    // makes everything below it unwind first -- the workers stopped and reaped, the store closed, the
    // spawner's temporary folder removed, a worker's process group and shared memory released --
    // whatever the program's main() does with the exception afterwards.
    try {
      switch (role()) {
        case ProcessRole::single: Base::run(n_epoch, loader, valid_loader); return;
        case ProcessRole::spawner: run_spawner(n_epoch, loader); return;
        case ProcessRole::spawned_worker:
        case ProcessRole::launched_worker: run_worker(n_epoch, loader, valid_loader); return;
      }
    } catch (const StoppedBySignal& stopped) {
      // The workers are gone; what the user can do next depends on the add-ons (StateManager: resume).
      const std::string resume = this->resume_hint();
      TINYDDP_FAIL(stopped.message(), hint(resume.empty() ? "nothing was saved; a trainer with StateManager and a "
                                                            "checkpoint directory resumes where it stopped"
                                                          : resume));
    } catch (...) {
      throw;
    }
  }

 protected:
  Tensor forward(const Tensor& input) override {
    // ZeRO's all-gathers of the weights updated by the last step end here (ddp_->forward would wait
    // too; an evaluation forward bypasses it).
    if (zero_) zero_->wait_for_parameters();
    // Only a training forward goes through DDP: it arms the reducer for the backward pass to come.
    if (ddp_ && this->is_training()) return ddp_->forward(input);
    return Base::forward(input);
  }
  void backward(const Tensor& output_grad) override {
    if (!ddp_) return Base::backward(output_grad);
    // Buckets are all-reduced while this runs; it returns once every gradient is the global average.
    ddp_->backward(output_grad, /*want_input_grad=*/false);
  }
  void on_epoch_end(const EpochRecord& record) override {
    // Every rank, before an add-on after this one (StateManager) saves on rank 0: the sharded state
    // consolidated, so the checkpoint holds all of it. Only then: it costs the unsharded state's memory.
    if (zero_ && this->saves_state_each_epoch()) zero_->consolidate_state_dict();
    Base::on_epoch_end(record);
  }
  void all_reduce_sum(std::vector<double>& values) override {
    Base::all_reduce_sum(values);
    if (this->process_group()) multi_device::all_reduce_sum(*this->process_group(), this->device(), values);
  }

 private:
  void run_spawner(int64_t n_epoch, DataLoader& loader) {
    multi_device::check_zero_options(options_, this->options());
    multi_device::check_comm_hook(options_);
    // The schedule checked (and sized) as every worker will, before any of them starts.
    const int world = int(this->devices().size());
    this->fit_schedule_to_run(n_epoch, multi_device::batches_per_rank(loader, world), world);
    // Held until rank 0's state is loaded: a signal after the workers are done still unwinds.
    StopSignals stop_signals;
    std::shared_ptr<const std::string> result_dir;
    {
      // However the workers ended -- a worker killed mid-write included -- what they leave in the
      // add-ons' files goes once they are gone (StateManager: a checkpoint's temporaries).
      struct AfterWorkers {
        MultiDevice& trainer;
        ~AfterWorkers() { trainer.on_workers_ended(); }
      } after_workers{*this};
      result_dir = multi_device::spawn_workers(this->devices(), options_);
    }
    multi_device::load_result(*result_dir, *this);
    if (int signal = StopSignals::take())
      throw StoppedBySignal("MultiDevice: stopped by signal " + std::to_string(signal) + " after the workers were done",
                            signal, __FILE__, __LINE__);
    this->set_distributed(0, world, nullptr);
  }

  void run_worker(int64_t n_epoch, DataLoader& loader, DataLoader* valid_loader) {
    multi_device::JoinedJob job = multi_device::join_job(this->devices(), options_);
    try {
      train_as_rank(job, n_epoch, loader, valid_loader);
    } catch (const Error& e) {
      multi_device::report_failure(job, e.problem(), e.hint());
      throw;
    } catch (const std::exception& e) {
      multi_device::report_failure(job, e.what(), "");
      throw;
    }
  }

  void train_as_rank(const multi_device::JoinedJob& job, int64_t n_epoch, DataLoader& loader,
                     DataLoader* valid_loader) {
    this->set_distributed(job.rank, job.world_size, job.group);
    // The model must sit on its device before DDP lays the gradient buckets out there.
    this->set_device(job.device);
    multi_device::check_zero_options(options_, this->options());
    multi_device::check_comm_hook(options_);
    ddp_ = std::make_unique<DistributedDataParallel>(this->model(), job.group, options_.ddp);
    if (!options_.comm_hook.empty() && options_.comm_hook != "allreduce")
      ddp_->register_comm_hook(nullptr, comm_hooks::by_name(options_.comm_hook));
    struct DropDdp {  // the wrapper unhooks the parameters when the run ends, however it ends
      MultiDevice& trainer;
      ~DropDdp() {
        trainer.set_stepping_optimizer(nullptr);
        trainer.zero_.reset();  // it refers to the DDP wrapper
        trainer.ddp_.reset();
      }
    } drop{*this};
    if (options_.zero_stage == 1) {
      zero_ = std::make_unique<ZeroRedundancyOptimizer>(*ddp_, this->given_optimizer());
      this->set_stepping_optimizer(zero_.get());
    }

    auto train = multi_device::shard_loader(loader, job.rank, job.world_size);
    std::unique_ptr<DataLoader> valid;
    if (valid_loader) valid = multi_device::shard_loader(*valid_loader, job.rank, job.world_size);
    Base::run(n_epoch, train ? *train : loader, valid ? valid.get() : valid_loader);

    // Every rank, when rank 0 hands its state to a spawner (a launched worker's given optimizer keeps
    // no state after run(): its checkpoints have it).
    if (zero_ && !job.result_dir.empty()) zero_->consolidate_state_dict();
    if (!job.result_dir.empty() && job.rank == 0) multi_device::save_result(job.result_dir, *this);
    multi_device::leave_job(job);
  }

  MultiDeviceOptions options_;
  std::unique_ptr<DistributedDataParallel> ddp_;
  std::unique_ptr<ZeroRedundancyOptimizer> zero_;  // with zero_stage 1, while a worker trains
};

}  // namespace tinyddp::nn
