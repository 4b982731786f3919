#include "tinyddp/nn/train/progress_bar.h"

#include <unistd.h>

#include <algorithm>

namespace tinyddp::nn {

namespace {

constexpr int kBarCells = 24;
constexpr auto kLiveInterval = std::chrono::milliseconds(100);

std::string format(const char* fmt, auto... values) {
  char buffer[256];
  int n = std::snprintf(buffer, sizeof buffer, fmt, values...);
  return std::string(buffer, size_t(std::clamp(n, 0, int(sizeof buffer) - 1)));
}

}  // namespace

ProgressBar::ProgressBar(std::FILE* stream, std::optional<bool> live, std::chrono::milliseconds plain_interval)
    : stream_(stream ? stream : stderr),
      live_(live.value_or(isatty(fileno(stream_)) == 1)),
      plain_interval_(plain_interval) {}

ProgressBar::~ProgressBar() {
  // Leave the terminal on a fresh line if the run ended (or threw) mid-epoch.
  if (live_width_ > 0) write("\n");
}

void ProgressBar::update(int64_t epoch, int64_t epochs, const char* phase, int64_t batch, int64_t batches, double loss,
                         double lr) {
  auto now = std::chrono::steady_clock::now();
  bool last = batch >= batches;
  if (live_) {
    if (!last && now - last_draw_ < kLiveInterval) return;
  } else {
    // Plain output: nothing per batch unless an epoch runs long (the summary line follows anyway).
    // The first batch of an epoch only starts the clock.
    if (last_draw_ == std::chrono::steady_clock::time_point{}) {
      last_draw_ = now;
      return;
    }
    if (last || now - last_draw_ < plain_interval_) return;
  }
  last_draw_ = now;

  std::string text = format("epoch %3lld/%lld  %s %4lld/%lld", (long long)epoch + 1, (long long)epochs, phase,
                            (long long)batch, (long long)batches);
  if (live_) {
    int filled = batches > 0 ? int(kBarCells * std::min(batch, batches) / batches) : kBarCells;
    text += " [" + std::string(size_t(filled), '#') + std::string(size_t(kBarCells - filled), '.') + "]";
  }
  text += format("  loss %.4f  lr %.3e", loss, lr);
  if (live_) {
    // \r returns to the start of the line; pad with spaces to erase a longer previous line.
    std::string padded(1, '\r');
    padded += text;
    if (text.size() < live_width_) padded.append(live_width_ - text.size(), ' ');
    live_width_ = text.size();
    write(padded);
  } else {
    text += '\n';
    write(text);
  }
}

void ProgressBar::line(const std::string& text) {
  clear_live_line();
  write(text);
  write("\n");
  // The next epoch's first plain batch line waits a full interval again.
  last_draw_ = std::chrono::steady_clock::time_point{};
}

void ProgressBar::clear_live_line() {
  if (live_width_ == 0) return;
  std::string blank(1, '\r');
  blank.append(live_width_, ' ');
  blank += '\r';
  write(blank);
  live_width_ = 0;
}

void ProgressBar::write(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stream_);
  std::fflush(stream_);
}

}  // namespace tinyddp::nn
