// Trace: a Chrome-trace timeline of the whole run, every rank in one file.
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
#pragma once

#include <string>
#include <type_traits>

#include "tinyddp/core/trace.h"
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

  void on_run_end() override {
    Base::on_run_end();
    written_path_.clear();
    if (!trace::enabled()) return;
    trace::record_instant("run ends", "host", trace::Lane::host);
    trace::flush();    // this rank's events -> <path>.rank<r>
    this->barrier();   // every rank's file is complete before rank 0 reads them
    written_path_ = this->is_rank_zero() ? trace::merge(trace::path(), this->world_size()) : trace::path();
  }

 private:
  std::string requested_path_;
  std::string written_path_;
};

}  // namespace tinyddp::nn
