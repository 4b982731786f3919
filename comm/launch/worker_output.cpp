#include "tinyddp/comm/launch/worker_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "tinyddp/core/error.h"

namespace tinyddp::comm {
namespace {

void write_all(int fd, std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed terminal or pipe: the line is lost, the job goes on
    at += size_t(n);
  }
}

int parse_rank(std::string_view word, const std::string& list) {
  int rank = -1;
  auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), rank);
  TINYDDP_CHECK(!word.empty() && error == std::errc() && end == word.data() + word.size() && rank >= 0,
                "--print-ranks ", list, ": '", word, "' is not a rank",
                hint("give ranks and ranges, as in 0 or 0,4-7, or all"));
  return rank;
}

}  // namespace

std::optional<std::set<int>> parse_rank_list(const std::string& text, int world_size) {
  if (text == "all") return std::nullopt;
  std::set<int> ranks;
  std::string_view rest = text;
  for (;;) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t dash = item.find('-');
    const int first = parse_rank(item.substr(0, dash), text);
    const int last = dash == std::string_view::npos ? first : parse_rank(item.substr(dash + 1), text);
    TINYDDP_CHECK(first <= last, "--print-ranks ", text, ": the range ", item, " runs backwards",
                  hint("write the lower rank first (", last, "-", first, ")"));
    TINYDDP_CHECK(last < world_size, "--print-ranks ", text, ": rank ", last,
                  " is not in this job, whose ranks are 0 to ", world_size - 1,
                  hint("count the ranks over every node (--nnodes x --nproc-per-node)"));
    for (int r = first; r <= last; ++r) ranks.insert(r);
    if (comma == std::string_view::npos) return ranks;
    rest.remove_prefix(comma + 1);
  }
}

std::string expand_prefix(const std::string& prefix, int rank, int local_rank, int node) {
  std::string out;
  for (size_t at = 0; at < prefix.size();) {
    const size_t open = prefix.find('{', at);
    out += prefix.substr(at, open - at);
    if (open == std::string::npos) break;
    const size_t close = prefix.find('}', open);
    const std::string field = prefix.substr(open, close == std::string::npos ? std::string::npos : close - open + 1);
    if (field == "{rank}")
      out += std::to_string(rank);
    else if (field == "{local_rank}")
      out += std::to_string(local_rank);
    else if (field == "{node}")
      out += std::to_string(node);
    else
      TINYDDP_FAIL("--prefix '", prefix, "': ", field, " is not a field it can fill in",
                   hint("use {rank}, {local_rank} or {node}, or '' for no prefix"));
    at = close + 1;
  }
  return out;
}

// The log files, opened on a worker's first line on each stream.
struct WorkerOutput::Files {
  std::mutex mutex;
  std::map<std::pair<int, int>, int> fds;  // (rank, stream) -> descriptor
  ~Files() {
    for (auto& [key, fd] : fds)
      if (fd >= 0) ::close(fd);
  }
};

WorkerOutput::WorkerOutput(WorkerOutputOptions options, int nproc_per_node, int node_rank)
    : options_(std::move(options)),
      nproc_per_node_(nproc_per_node),
      node_rank_(node_rank),
      files_(std::make_shared<Files>()) {
  expand_prefix(options_.prefix, 0, 0, 0);  // a template with a field it does not know fails here, before any worker
  if (options_.log_dir.empty()) return;
  std::error_code error;
  std::filesystem::create_directories(options_.log_dir, error);
  TINYDDP_CHECK(std::filesystem::is_directory(options_.log_dir), "--log-dir ", options_.log_dir,
                ": cannot create that directory", (error ? " (" + error.message() + ")" : std::string()),
                hint("name a directory under one you can write"));
  TINYDDP_CHECK(::access(options_.log_dir.c_str(), W_OK) == 0, "--log-dir ", options_.log_dir,
                ": this user cannot write there (", std::strerror(errno), ")", hint("name a directory you can write"));
}

void WorkerOutput::operator()(int rank, int stream, std::string_view line) const {
  if (!options_.log_dir.empty()) {
    std::lock_guard<std::mutex> lock(files_->mutex);
    auto [it, added] = files_->fds.try_emplace({rank, stream}, -1);
    if (added) {
      const std::string path = options_.log_dir + "/rank" + std::to_string(rank) +
                               (stream == 2 ? ".stderr" : ".stdout");
      it->second = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    }
    if (it->second >= 0) {
      write_all(it->second, line);
      write_all(it->second, "\n");
    }
  }
  if (stream != 2 && options_.print_ranks && !options_.print_ranks->count(rank)) return;
  const int local_rank = rank - node_rank_ * nproc_per_node_;
  write_all(stream == 2 ? 2 : 1,
            expand_prefix(options_.prefix, rank, local_rank, node_rank_) + std::string(line) + "\n");
}

}  // namespace tinyddp::comm
