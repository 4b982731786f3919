#include "tinyddp/nn/train/addons/history_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "tinyddp/core/error.h"
#include "tinyddp/core/remove_on_stop_signal.h"

namespace tinyddp::nn {
namespace {

void write_text(int fd, const std::string& text, const std::string& path) {
  for (size_t at = 0; at < text.size();) {
    ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    TINYDDP_CHECK(n > 0, "writing ", path, " failed: ", std::strerror(errno),
                  hint("check free disk space and permissions"));
    at += size_t(n);
  }
}

void sync_and_close(int fd, const std::string& path) {
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  const bool closed = ::close(fd) == 0;
  TINYDDP_CHECK(synced && closed, "writing ", path, " failed: ", std::strerror(synced ? errno : sync_errno),
                hint("check free disk space and the disk"));
}

}  // namespace

void append_history_line(const std::string& path, const EpochRecord& record) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  TINYDDP_CHECK(fd >= 0, "cannot open ", path, " to add epoch ", record.epoch + 1, "'s record: ", std::strerror(errno),
                hint("check that the checkpoint directory is still there and writable"));
  try {
    write_text(fd, epoch_record_json(record) + "\n", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  sync_and_close(fd, path);
}

std::vector<EpochRecord> read_history(const std::string& path, int64_t epochs_done) {
  std::vector<EpochRecord> records;
  std::ifstream in(path);
  if (!in) return records;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    // Only the last line can be cut short (a crash in the middle of an append); it has no newline.
    const bool last_and_unfinished = in.eof();
    if (line.empty()) continue;
    try {
      EpochRecord record = epoch_record_from_json(line);
      if (record.epoch < epochs_done) records.push_back(std::move(record));
    } catch (const Error& e) {
      if (last_and_unfinished) break;
      TINYDDP_FAIL(path, " line ", number, ": ", e.message());
    }
  }
  // One record per epoch, the last written winning (an epoch that ran again after a crash).
  std::stable_sort(records.begin(), records.end(),
                   [](const EpochRecord& a, const EpochRecord& b) { return a.epoch < b.epoch; });
  std::vector<EpochRecord> unique;
  for (EpochRecord& r : records) {
    if (!unique.empty() && unique.back().epoch == r.epoch)
      unique.back() = std::move(r);
    else
      unique.push_back(std::move(r));
  }
  return unique;
}

void write_history(const std::string& path, const std::vector<EpochRecord>& records) {
  // <file>.tmp.<pid>.0, as save_safetensors names its temporaries: what a killed writer leaves is
  // found and removed by the same rule (state_manager.h's remove_*_temporaries).
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + ".0";
  const RemoveOnStopSignal removed_if_stopped(tmp);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TINYDDP_CHECK(fd >= 0, "cannot create ", tmp, ": ", std::strerror(errno),
                hint("check that the checkpoint directory is still there and writable"));
  try {
    std::string text;
    for (const EpochRecord& r : records) text += epoch_record_json(r) + "\n";
    write_text(fd, text, tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  sync_and_close(fd, tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    TINYDDP_FAIL("cannot move ", tmp, " to ", path, ": ", std::strerror(err),
                 hint("check that ", path, " is not a directory"));
  }
}

}  // namespace tinyddp::nn
