// The collective benchmarks' command line: every bad flag is refused by name, with a message that
// says what to write instead, before anything starts (bench/perf/perf_options.h).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "bench/perf/perf_collective.h"
#include "bench/perf/perf_options.h"

using namespace tinyddp;
using namespace tinyddp::bench;

namespace {

std::optional<PerfOptions> parse(std::vector<std::string> args,
                                 const PerfCollective& collective = all_reduce_collective()) {
  args.insert(args.begin(), "/path/to/all_reduce_perf");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return parse_perf_options(int(argv.size()), argv.data(), collective);
}

// The message `args` is refused with ("" when accepted).
std::string refusal(const std::vector<std::string>& args, const PerfCollective& collective = all_reduce_collective()) {
  try {
    parse(args, collective);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the defaults are nccl-tests' and the sizes run as nccl-tests runs them") {
  PerfOptions o = *parse({});
  CHECK(o.min_bytes == 32u << 20);
  CHECK(o.max_bytes == 32u << 20);
  CHECK(o.iters == 20);
  CHECK(o.warmup_iters == 1);
  CHECK(o.check);
  CHECK_FALSE(o.blocking);
  CHECK(o.average == 1);
  CHECK(o.types == std::vector<DType>{DType::f32});
  CHECK(o.program == "all_reduce_perf");
  CHECK(o.sizes() == std::vector<size_t>{32u << 20});

  CHECK(parse({"-b", "8", "-e", "128M", "-f", "2"})->sizes().size() == 25);  // 8 B, 16 B, ..., 128 MiB
  CHECK(parse({"-b", "1K", "-e", "4K", "-i", "1K"})->sizes() == std::vector<size_t>{1024, 2048, 3072, 4096});
  CHECK(parse({"-b", "1.5K", "-e", "1.5K"})->min_bytes == 1536);
  CHECK(parse({"-b", "64KiB", "-e", "1GB"})->max_bytes == size_t(1) << 30);
  CHECK(parse({"-d", "all"})->types.size() == 6);  // float, double, bfloat16, half, int32, int64
  CHECK(parse({"-d", "bf16"})->types == std::vector<DType>{DType::bf16});
  CHECK(parse({"-d", "half"})->types == std::vector<DType>{DType::f16});
  CHECK(parse({"-o", "all"})->ops.size() == 5);
  CHECK(parse({"--json", "out.json"})->json_file == "out.json");  // the old name of -J
}

TEST_CASE("every bad flag is refused with a message that names it") {
  CHECK(refusal({"-b", "abc"}) == "-b: 'abc' is not a size (examples: 8, 64K, 1M)");
  CHECK(refusal({"-e", "12Q"}) == "-e: '12Q' is not a size (examples: 8, 64K, 1M)");
  CHECK(refusal({"-b", "-5"}) == "-b: '-5' is not a size (examples: 8, 64K, 1M)");
  CHECK(refusal({"-i", "0x10"}) == "-i: '0x10' is not a size (examples: 8, 64K, 1M)");
  CHECK(refusal({"-e", "1e30"}).find("-e: '1e30' is beyond any buffer") == 0);
  CHECK(refusal({"-b", "1M", "-e", "1K"}) ==
        "-b 1M (1048576 bytes) is larger than -e 1K (1024 bytes); the rows run from -b up to -e");
  CHECK(refusal({"-c", "2"}) == "-c must be 0 or 1, got 2 (1 checks every element of one more run per size)");
  CHECK(refusal({"-z", "3"}) == "-z must be 0 or 1, got 3 (0 launches the iterations back to back, 1 waits for each)");
  CHECK(refusal({"-c", "yes"}) == "-c: 'yes' is not a whole number");
  CHECK(refusal({"-n", "0"}) == "-n must be at least 1, got 0");
  CHECK(refusal({"-w", "-1"}) == "-w must be at least 0, got -1");
  CHECK(refusal({"-f", "1.5"}) == "-f: '1.5' is not a whole number");
  CHECK(refusal({"-f", "2", "-i", "1K"}).find("-f and -i are both given") == 0);
  CHECK(refusal({"-b", "0", "-f", "2"}).find("-b 0 with -f 2: a size of 0 never grows") == 0);
  CHECK(refusal({"-b", "1", "-e", "1G", "-i", "1"}).find("makes more than 10000 rows") != std::string::npos);
  CHECK(refusal({"-a", "4"}) == "-a must be between 0 and 3, got 4 (0 rank 0, 1 mean, 2 min, 3 max)");
  CHECK(refusal({"-I", "2"}) == "-I must be 0 or 1, got 2");
  CHECK(refusal({"-K", "3"}) == "-K 3 needs per-iteration timing: add -I 1");
  CHECK(refusal({"-I", "1", "-n", "5", "-K", "5"}).find("-K must be below -n (5), got 5") == 0);
  CHECK(refusal({"-d", "int8"}) ==
        "-d: 'int8' is not a datatype tinyddp's collectives take; use float, double, bfloat16, half, int32, int64 or "
        "all");
  CHECK(refusal({"-o", "xor"}) == "-o: 'xor' is not a reduction; use sum, prod, max, min, avg or all");
  CHECK(refusal({"-r", "x"}, broadcast_collective()) == "-r: 'x' is not a whole number");
  CHECK(refusal({"-g", "2"}).find("-g must be between 1 and 1, got 2 (one device per rank") == 0);
  CHECK(refusal({"-t", "4"}).find("-t must be between 1 and 1, got 4 (one rank per process") == 0);
  CHECK(refusal({"-G", "1"}).find("-G 1: CUDA graph replay is an NCCL-tests feature tinyddp does not have") == 0);
  CHECK(refusal({"-G", "0"}).empty());
  CHECK(refusal({"--backend", "gloo2"}).find("--backend: 'gloo2' is not a backend of this build; it has host") == 0);
  CHECK(refusal({"--backend", "ring"})
            .find("--backend: 'ring' is not a backend; the backend is called 'host' now; 'ring' "
                  "is one of its algorithms") == 0);
  CHECK(refusal({"--transport", "rdma"}) == "--transport: 'rdma' is not a transport; use tcp, shm or auto");
  CHECK(refusal({"--algo", "tree"})
            .find("--algo: 'tree' is not an algorithm the host backend has for all_reduce; use auto, "
                  "ring, direct, rd, rabenseifner or hier") == 0);
  CHECK(refusal({"--algo", "direct"}, all_gather_collective()).find("for all_gather; use auto or ring") !=
        std::string::npos);
  CHECK(refusal({"--device", "gpu"}) == "--device: 'gpu' is not a device; use cpu, cuda or cuda:N");
  CHECK(refusal({"--init-method", "file:///tmp/x"}).find("--init-method: 'file:///tmp/x' is neither") == 0);
  CHECK(refusal({"-J", "out.txt"}) == "-J: 'out.txt' does not end in .json, the one format nccl-tests' -J writes");
  CHECK(refusal({"--bogus"}).find("--bogus") != std::string::npos);
  CHECK(refusal({"stray"}).find("stray") != std::string::npos);
}

TEST_CASE("the algorithms --algo accepts come from what the backend has") {
  CHECK(parse({"--algo", "ring"})->algo == "ring");
  CHECK(parse({"--algo", "direct"})->algo == "direct");
  CHECK(parse({"--algo", "rd"})->algo == "rd");
  CHECK(parse({"--algo", "rabenseifner"})->algo == "rabenseifner");
  CHECK(parse({"--algo", "hier"})->algo == "hier");
  CHECK(parse({"--algo", "ring"}, broadcast_collective())->algo == "ring");
  CHECK(refusal({"--algo", ""}).find("--algo: empty") == 0);
}

TEST_CASE("-R takes nccl-tests' buffer registration: 0 ordinary, 2 symmetric; others are refused by name") {
  CHECK(parse({})->registration == 0);
  CHECK(parse({"-R", "0"})->registration == 0);
  CHECK(parse({"-R", "2"})->registration == 2);
  CHECK(parse({"--local_register", "2"})->registration == 2);
  CHECK(refusal({"-R", "1"}).find("-R 1: registering buffers allocated as usual") == 0);
  CHECK(refusal({"-R", "3"}) == "-R must be between 0 and 2, got 3 (0 ordinary buffers, 2 symmetric buffers)");
  CHECK(refusal({"-R", "x"}) == "-R: 'x' is not a whole number");
  CHECK(refusal({"-R", "2", "--device", "cuda"}).find("-R 2: symmetric buffers are host memory") == 0);
}

TEST_CASE("--rewrite 1 needs each call awaited (-z 1) and host memory, and says so") {
  CHECK_FALSE(parse({})->rewrite);
  CHECK(parse({"-z", "1", "--rewrite", "1"})->rewrite);
  CHECK_FALSE(parse({"--rewrite", "0"})->rewrite);
  CHECK(refusal({"--rewrite", "1"}) ==
        "--rewrite 1 writes the input before each call, which needs each call done first: add -z 1");
  CHECK(refusal({"-z", "1", "--rewrite", "1", "--device", "cuda"}).find("--rewrite 1 writes host memory") == 0);
  CHECK(refusal({"--rewrite", "2"}).find("--rewrite must be 0 or 1, got 2") == 0);
}
