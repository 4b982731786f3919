#include "tinyddp/nn/train/addons/checkpoint_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "tinyddp/core/error.h"

namespace tinyddp::nn {

namespace {

std::string holder_line() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char when[64] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
  return "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when;
}

std::string read_all(int fd) {
  std::string text;
  char buffer[512];
  ssize_t n;
  while ((n = ::pread(fd, buffer, sizeof buffer, off_t(text.size()))) > 0) text.append(buffer, size_t(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

// Whether `fd` is still the file named `path`: a holder removes the name when it lets go, and a file
// locked after that is one nobody else will ever find.
bool still_named(int fd, const std::string& path) {
  struct stat open_file {
  }, named{};
  return ::fstat(fd, &open_file) == 0 && ::stat(path.c_str(), &named) == 0 && open_file.st_dev == named.st_dev &&
         open_file.st_ino == named.st_ino;
}

}  // namespace

std::string CheckpointDirLock::path_in(const std::string& directory) { return directory + "/lock"; }

CheckpointDirLock::CheckpointDirLock(const std::string& directory) : path_(path_in(directory)) {
  for (;;) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TINYDDP_CHECK(fd >= 0, "StateManager: cannot create the lock file ", path_, ": ", std::strerror(errno),
                  hint("the checkpoint directory must be writable"));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      const std::string holder = read_all(fd);
      ::close(fd);
      TINYDDP_CHECK(error == EWOULDBLOCK, "StateManager: cannot lock ", path_, ": ", std::strerror(error),
                    hint("the file system must support flock (local disks and NFS do)"));
      TINYDDP_FAIL("StateManager: the checkpoint directory ", directory, " is in use by another job (",
                   holder.empty() ? "its holder has not written its name yet" : holder,
                   "); two jobs in one directory would overwrite each other's checkpoints",
                   hint("wait for that "
                        "job to end, stop it, or give this one another directory"));
    }
    if (!still_named(fd, path_)) {  // its holder removed it between our open and our flock: again
      ::close(fd);
      continue;
    }
    const std::string line = holder_line() + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, line.data(), line.size(), 0) != ssize_t(line.size())) {
      const int error = errno;
      ::unlink(path_.c_str());
      ::close(fd);
      TINYDDP_FAIL("StateManager: cannot write ", path_, ": ", std::strerror(error),
                   hint("the checkpoint directory's file system is full or failing"));
    }
    fd_ = fd;
    removed_if_stopped_ = std::make_unique<RemoveOnStopSignal>(path_);
    return;
  }
}

CheckpointDirLock::~CheckpointDirLock() {
  removed_if_stopped_.reset();
  // The name first, while the lock still keeps everyone else out; then the lock (with the descriptor).
  ::unlink(path_.c_str());
  ::close(fd_);
}

void remove_stale_lock(const std::string& directory) {
  const std::string path = CheckpointDirLock::path_in(directory);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && still_named(fd, path)) ::unlink(path.c_str());
  ::close(fd);
}

}  // namespace tinyddp::nn
