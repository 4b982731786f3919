// ProgressBar: what the Trainer shows while it runs (the seed draws the same with tqdm).
//
// On a terminal it redraws one line in place as batches go by:
//
//   epoch  3/10  train  12/32 [########..............]  loss 0.6931  lr 9.76e-04
//
// and replaces it with the epoch's summary when the epoch ends. Anywhere else (a log file, a pipe, a
// CI job) there is no "in place", so it writes plain lines instead: the summary of every epoch, and
// a batch line at most every `plain_interval` for epochs long enough to need one.
//
// It writes to stderr by default, as tqdm does: stdout stays free for what the program itself
// prints, and library code never writes to stdout.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace tinyddp::nn {

class ProgressBar {
 public:
  // live: redraw in place; unset: only when `stream` is a terminal.
  explicit ProgressBar(std::FILE* stream = stderr, std::optional<bool> live = std::nullopt,
                       std::chrono::milliseconds plain_interval = std::chrono::seconds(10));
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool live() const { return live_; }

  // Batch `batch` (1-based) of `batches` of `phase` ("train", "valid") in epoch `epoch` (0-based) of
  // `epochs` is done; loss is the running mean so far. Redraws are throttled (a terminal that redraws
  // a thousand times a second slows the training it reports on); the last batch is always drawn.
  void update(int64_t epoch, int64_t epochs, const char* phase, int64_t batch, int64_t batches, double loss, double lr);
  // Writes one finished line (an epoch summary), erasing the live line first.
  void line(const std::string& text);

 private:
  void write(const std::string& text);
  void clear_live_line();

  std::FILE* stream_;
  bool live_;
  std::chrono::milliseconds plain_interval_;
  std::chrono::steady_clock::time_point last_draw_{};
  size_t live_width_ = 0;  // characters of the live line on screen now (0: none)
};

}  // namespace tinyddp::nn
