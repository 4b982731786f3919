// Trace, the Trainer add-on: a Chrome-trace timeline of the whole run, every rank in one file.
//
//   TINYDDP_TRACE=run.json build/bin/dummy_mgpu      (or trainer.set_trace_file("run.json"))
//
// then open run.json in https://ui.perfetto.dev or chrome://tracing. Each rank is one process row with
// lanes: "compute" (train_step, the backward pass and, inside it, each layer's forward and backward,
// the optimizer step), "communication" (each gradient bucket's all-reduce, with the instant it became
// ready), and "data loading" (time spent waiting for the next batch). It is how you *see* what DDP
// is for: bucket 0's all-reduce running on the communication lane while the backward pass of the
// earlier layers is still going on the compute lane.
//
// Recording itself is core/trace.h (the Trainer and the layers record their spans there whenever
// tracing is on, and DDP's buckets go there through nn/ddp/bucket_timeline.h). This add-on starts it
// for the run, and at the end has every rank write its events and rank 0 merge them into the one file.
//
// Straggler view: at the end of each epoch, while tracing or with TINYDDP_DEBUG=INFO, every rank's
// time inside collectives over the epoch is summed over the ranks (one small all-reduce), and each
// rank says how long it waited for the slowest one (straggler_report.h): logged with INFO, and an
// instant on the communication lane of the timeline carrying every rank's seconds.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/log.h"
#include "tinyddp/core/trace.h"
#include "tinyddp/nn/train/addons/straggler_report.h"
#include "tinyddp/nn/train/trainer.h"

namespace tinyddp::nn {

template <class Base>
class Trace : public Base {
  static_assert(std::is_base_of_v<Trainer, Base>, "Trace<Base>: Base must derive from nn::Trainer");

 public:
  using Base::Base;

  // Where the merged timeline goes; TINYDDP_TRACE, when set, is used when this is not called.
  void set_trace_file(std::string path) { requested_path_ = std::move(path); }
  // The merged file of the last run ("" when tracing was off).
  const std::string& trace_file() const { return written_path_; }

 protected:
  void on_run_begin(int64_t n_epoch) override {
    // Start before the wrapped add-ons run their part, so that even restoring a checkpoint is on the
    // timeline. trace::enabled() reads TINYDDP_TRACE and refuses a path that cannot be written: here,
    // before anything trains.
    (void)trace::enabled();
    if (!requested_path_.empty() && trace::path() != requested_path_) trace::start(requested_path_, this->rank());
    if (trace::enabled()) {
      trace::set_rank(this->rank());
      trace::record_instant("run begins", "host", trace::Lane::host);
    }
    Base::on_run_begin(n_epoch);
  }

  void on_epoch_end(const EpochRecord& record) override {
    Base::on_epoch_end(record);
    report_time_in_collectives(record.epoch);
  }

  void on_run_end() override {
    Base::on_run_end();
    written_path_.clear();
    if (!trace::enabled()) return;
    trace::record_instant("run ends", "host", trace::Lane::host);
    trace::flush();   // this rank's events -> <path>.rank<r>
    this->barrier();  // every rank's file is complete before rank 0 reads them
    written_path_ = this->is_rank_zero() ? trace::merge(trace::path(), this->world_size()) : trace::path();
  }

 private:
  void report_time_in_collectives(int64_t epoch) {
    comm::ProcessGroup* group = this->process_group();
    const bool logging = debug_level() >= DebugLevel::info;
    if (!group || group->size() < 2 || (!logging && !trace::enabled())) return;  // the same choice on every rank
    const comm::ProcessGroup::CollectiveTime now = group->time_in_collectives();
    std::vector<double> by_rank(size_t(group->size()), 0.0);
    by_rank[size_t(group->rank())] = now.seconds - reported_.seconds;
    const uint64_t collectives = now.collectives - reported_.collectives;
    reported_ = now;
    this->all_reduce_sum(by_rank);
    const std::string line = straggler_line(group->rank(), epoch, collectives, by_rank);
    if (logging) log_line(LogLevel::info, "ddp", line);
    if (trace::enabled()) {
      std::string args = "{\"epoch\": " + std::to_string(epoch) + ", \"seconds_in_collectives_by_rank\": [";
      for (size_t r = 0; r < by_rank.size(); ++r) args += (r ? ", " : "") + std::to_string(by_rank[r]);
      trace::record_instant("time in collectives", "communication", trace::Lane::comm, args + "]}");
    }
  }

  comm::ProcessGroup::CollectiveTime reported_;
  std::string requested_path_;
  std::string written_path_;
};

}  // namespace tinyddp::nn
