#include "bench/perf/perf_options.h"

#include <CLI/CLI.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/core/command_line.h"
#include "bench/perf/algorithm_choice.h"
#include "bench/perf/perf_collective.h"

namespace tinyddp::bench {
namespace {

// More rows than this is a typo in -b/-e/-i, not a benchmark anyone waits for.
constexpr size_t kMaxRows = 10000;

// Every DType the core has; the collectives take those comm::is_collective_dtype accepts.
constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8};
// nccl-tests' order for -o all.
constexpr comm::ReduceOp kAllOps[] = {comm::ReduceOp::sum, comm::ReduceOp::prod, comm::ReduceOp::max,
                                      comm::ReduceOp::min, comm::ReduceOp::avg};

std::string join(const std::vector<std::string>& names, const std::string& last_sep = " or ") {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : (i + 1 == names.size() ? last_sep : ", ")) + names[i];
  return text;
}

// A whole number in [lo, hi], or a UsageError naming the flag. `note` explains the range.
int64_t parse_whole(const std::string& flag, const std::string& text, int64_t lo, int64_t hi,
                    const std::string& note = "") {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError(flag + ": '" + text + "' is not a whole number");
  if (value < lo || value > hi) {
    std::string range = lo == 0 && hi == 1 ? "0 or 1"
                        : hi >= std::numeric_limits<int>::max()
                            ? "at least " + std::to_string(lo)
                            : "between " + std::to_string(lo) + " and " + std::to_string(hi);
    throw UsageError(flag + " must be " + range + ", got " + text + (note.empty() ? "" : " (" + note + ")"));
  }
  return value;
}

std::vector<std::string> collective_type_names() {
  std::vector<std::string> names;
  for (DType t : kAllDTypes)
    if (comm::is_collective_dtype(t)) names.push_back(nccl_type_name(t));
  return names;
}

std::vector<DType> parse_types(const std::string& text) {
  std::vector<DType> all;
  for (DType t : kAllDTypes)
    if (comm::is_collective_dtype(t)) all.push_back(t);
  if (text == "all") return all;
  for (DType t : all)
    if (text == nccl_type_name(t) || text == dtype_name(t)) return {t};
  throw UsageError("-d: '" + text + "' is not a datatype tinyddp's collectives take; use " +
                   join(collective_type_names(), ", ") + " or all");
}

std::vector<comm::ReduceOp> parse_ops(const std::string& text) {
  if (text == "all") return {std::begin(kAllOps), std::end(kAllOps)};
  for (comm::ReduceOp op : kAllOps)
    if (text == comm::reduce_op_name(op)) return {op};
  throw UsageError("-o: '" + text + "' is not a reduction; use sum, prod, max, min, avg or all");
}

// The flags as given, before they are checked (kept as text so that every message can quote them).
struct FlagTexts {
  std::string b = "32M", e = "32M", i = "1M", f = "1", n = "20", w = "1", m = "1", N = "1";
  std::string o = "sum", d = "float", r = "0";
  std::string c = "1", z = "0", a = "1", I = "0", K = "0", S = "0", T = "0", u = "0", t = "1", g = "1", R = "0";
  std::string J, csv, backend = "host", transport = "auto", algo = "auto", device, init_method = "env://";
  std::string rewrite = "0";
  // nccl-tests flags that have no counterpart here: accepted at 0 (off), refused otherwise.
  struct Unsupported {
    const char* names;
    const char* what;
    std::string value = "0";
  };
  std::vector<Unsupported> unsupported = {
      {"-G,--cudagraph", "CUDA graph replay"},
      {"-C,--report_cputime", "reporting the CPU launch time (the times here are host wall-clock already)"},
      {"-D,--device_implementation", "NCCL's device-API kernels"},
      {"-y,--stream_null", "launching on the null CUDA stream"},
      {"-p,--parallel_init", "initialising several GPUs per process in parallel"},
      {"-M,--memory", "the GPU memory report"},
  };
  CLI::Option* f_option = nullptr;
  CLI::Option* i_option = nullptr;
};

void add_flags(CLI::App& app, FlagTexts& x, const PerfCollective& collective) {
  const std::string sizes = "Sizes", op = "Operation", perf = "Performance", test = "Test operation", ours = "tinyddp";
  app.add_option("-b,--minbytes", x.b, "smallest size in bytes (K, M, G: binary multiples)")
      ->capture_default_str()
      ->type_name("SIZE")
      ->group(sizes);
  app.add_option("-e,--maxbytes", x.e, "largest size in bytes")->capture_default_str()->type_name("SIZE")->group(sizes);
  x.i_option = app.add_option("-i,--stepbytes", x.i, "fixed increment between sizes")
                   ->capture_default_str()
                   ->type_name("SIZE")
                   ->group(sizes);
  x.f_option = app.add_option("-f,--stepfactor", x.f,
                              "multiply the size by this whole number between rows (overrides -i)")
                   ->capture_default_str()
                   ->type_name("N")
                   ->group(sizes);
  app.add_option("-o,--op", x.o,
                 collective.reduces() ? "sum, prod, max, min, avg or all" : "ignored: this collective does not reduce")
      ->capture_default_str()
      ->type_name("OP")
      ->group(op);
  app.add_option("-d,--datatype", x.d, join(collective_type_names(), ", ") + " or all")
      ->capture_default_str()
      ->type_name("TYPE")
      ->group(op);
  app.add_option("-r,--root", x.r,
                 collective.has_root() ? "the root rank, or all" : "ignored: this collective has no root")
      ->capture_default_str()
      ->type_name("RANK")
      ->group(op);
  app.add_option("-n,--iters", x.n, "timed iterations per size")->capture_default_str()->type_name("N")->group(perf);
  app.add_option("-w,--warmup_iters", x.w, "untimed iterations before each size's timed ones")
      ->capture_default_str()
      ->type_name("N")
      ->group(perf);
  app.add_option("-m,--agg_iters", x.m, "collectives launched together in each iteration")
      ->capture_default_str()
      ->type_name("N")
      ->group(perf);
  app.add_option("-N,--run_cycles", x.N, "run the whole sweep this many times (0: forever)")
      ->capture_default_str()
      ->type_name("N")
      ->group(perf);
  app.add_option("-a,--average", x.a, "the time reported across ranks: 0 rank 0, 1 mean, 2 min, 3 max")
      ->capture_default_str()
      ->type_name("0-3")
      ->group(perf);
  app.add_option("-I,--per_iter_timing", x.I,
                 "1: time every iteration and add min/max/p99/cv (as nccl-tests) and p50/p95 and the slowest rank "
                 "to each row; each iteration is then awaited before the next (-m keeps several back to back in one)")
      ->capture_default_str()
      ->type_name("0|1")
      ->group(perf);
  app.add_option("-K,--per_iter_skip", x.K, "leave this many first iterations out of the -I statistics")
      ->capture_default_str()
      ->type_name("N")
      ->group(perf);
  app.add_option("-c,--check", x.c, "1: check every element of one more run per size (#wrong)")
      ->capture_default_str()
      ->type_name("0|1")
      ->group(test);
  app.add_option("-z,--blocking", x.z,
                 "0: launch the iterations back to back and wait for the last; 1: blocking calls (each returns once "
                 "its collective is done, as MPI's)")
      ->capture_default_str()
      ->type_name("0|1")
      ->group(test);
  app.add_option("-S,--report_timestamps", x.S, "1: end each row with the time it finished")
      ->capture_default_str()
      ->type_name("0|1")
      ->group(test);
  app.add_option("-T,--timeout", x.T,
                 "seconds before a collective that does not finish is an error (0: the library's 300)")
      ->capture_default_str()
      ->type_name("SECONDS")
      ->group(test);
  app.add_option("-u,--unalign", x.u, "start the buffers this many elements past their aligned start")
      ->capture_default_str()
      ->type_name("N")
      ->group(test);
  app.add_option("-R,--local_register", x.R,
                 "0: ordinary buffers; 2: symmetric buffers, which every rank of a host maps (allocate_symmetric)")
      ->capture_default_str()
      ->type_name("0|2")
      ->group(test);
  app.add_option("-J,--output_file,--json", x.J,
                 "write nccl-tests' JSON to this .json file (never overwritten: FILE.0, FILE.1, ...)")
      ->type_name("FILE")
      ->group(test);
  app.add_option("-t,--nthreads", x.t, "threads per process: tinyddp runs one rank per process")
      ->capture_default_str()
      ->type_name("1")
      ->group(test);
  app.add_option("-g,--ngpus", x.g, "devices per thread: tinyddp runs one device per rank")
      ->capture_default_str()
      ->type_name("1")
      ->group(test);
  for (auto& u : x.unsupported)
    app.add_option(u.names, u.value, std::string("nccl-tests' ") + u.what + ": only 0 (off) here")
        ->capture_default_str()
        ->type_name("0")
        ->group("nccl-tests flags without a counterpart");
  app.add_option("--backend", x.backend, "host or nccl (" + join(comm::available_backends(), ", ") + " in this build)")
      ->capture_default_str()
      ->type_name("NAME")
      ->group(ours);
  app.add_option("--transport", x.transport, "host backend: tcp, shm or auto (shm within a host, tcp across)")
      ->capture_default_str()
      ->type_name("NAME")
      ->group(ours);
  app.add_option("--algo", x.algo, algorithm_help(collective))->capture_default_str()->type_name("NAME")->group(ours);
  app.add_option("--device", x.device, "cpu, cuda or cuda:N (default: cpu for host, the local rank's GPU for nccl)")
      ->type_name("DEVICE")
      ->group(ours);
  app.add_option("--rewrite", x.rewrite,
                 "1: every rank writes its input before each timed call, as a backward pass writes a bucket's "
                 "gradients, and the writes' time is left out (needs -z 1; host memory)")
      ->capture_default_str()
      ->type_name("0|1")
      ->group(ours);
  app.add_option("--init-method", x.init_method, "env:// (tinyddp-run, torchrun, srun, mpirun) or tcp://host:port")
      ->capture_default_str()
      ->type_name("URL")
      ->group(ours);
  app.add_option("--csv", x.csv, "also write the rows as CSV")->type_name("FILE")->group(ours);
}

void check_sizes(const FlagTexts& x, PerfOptions& o) {
  o.min_bytes = parse_size("-b", x.b);
  o.max_bytes = parse_size("-e", x.e);
  o.step_bytes = parse_size("-i", x.i);
  o.step_factor = size_t(parse_whole("-f", x.f, 1, 1 << 20, "a whole factor; 1 steps by -i instead"));
  if (o.min_bytes > o.max_bytes)
    throw UsageError("-b " + x.b + " (" + std::to_string(o.min_bytes) + " bytes) is larger than -e " + x.e + " (" +
                     std::to_string(o.max_bytes) + " bytes); the rows run from -b up to -e");
  if (x.f_option->count() > 0 && x.i_option->count() > 0)
    throw UsageError("-f and -i are both given: use one (-f multiplies the size between rows, -i adds to it)");
  if (o.step_factor > 1 && o.min_bytes == 0)
    throw UsageError("-b 0 with -f " + x.f + ": a size of 0 never grows; start at -b 1 or more, or step with -i");
  if (o.step_factor == 1 && o.step_bytes == 0 && o.min_bytes < o.max_bytes)
    throw UsageError("-i 0: the size would never grow from -b to -e; use -i 1 or more, or -f 2");
  const size_t rows = o.sizes(kMaxRows + 1).size();
  if (rows > kMaxRows)
    throw UsageError("-b " + x.b + " -e " + x.e + (o.step_factor > 1 ? " -f " + x.f : " -i " + x.i) +
                     " makes more than " + std::to_string(kMaxRows) + " rows; use a larger step (for example -f 2)");
}

void check_timing(const FlagTexts& x, PerfOptions& o) {
  constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
  o.iters = int(parse_whole("-n", x.n, 1, kMaxInt));
  o.warmup_iters = int(parse_whole("-w", x.w, 0, kMaxInt));
  o.agg_iters = int(parse_whole("-m", x.m, 1, kMaxInt));
  o.run_cycles = int(parse_whole("-N", x.N, 0, kMaxInt, "0 runs forever"));
  o.average = int(parse_whole("-a", x.a, 0, 3, "0 rank 0, 1 mean, 2 min, 3 max"));
  o.per_iter_timing = parse_whole("-I", x.I, 0, 1) == 1;
  o.per_iter_skip = int(parse_whole("-K", x.K, 0, kMaxInt));
  if (o.per_iter_skip > 0 && !o.per_iter_timing)
    throw UsageError("-K " + x.K + " needs per-iteration timing: add -I 1");
  if (o.per_iter_skip >= o.iters)
    throw UsageError("-K must be below -n (" + std::to_string(o.iters) + "), got " + x.K +
                     ": no iteration would be left");
  o.check = parse_whole("-c", x.c, 0, 1, "1 checks every element of one more run per size") == 1;
  o.blocking = parse_whole("-z", x.z, 0, 1, "0 launches the iterations back to back, 1 waits for each") == 1;
  o.report_timestamps = parse_whole("-S", x.S, 0, 1) == 1;
  o.timeout_s = int(parse_whole("-T", x.T, 0, 7 * 24 * 3600, "seconds; 0 keeps the library's default"));
  o.unalign = parse_whole("-u", x.u, 0, 1 << 20, "elements");
  o.registration = int(parse_whole("-R", x.R, 0, 2, "0 ordinary buffers, 2 symmetric buffers"));
  if (o.registration == 1)
    throw UsageError(
        "-R 1: registering buffers allocated as usual (NCCL's ncclCommRegister) has no counterpart in "
        "tinyddp; use -R 2 for symmetric buffers (ProcessGroup::allocate_symmetric) or -R 0");
  parse_whole("-t", x.t, 1, 1, "one rank per process: launch one process per rank with tinyddp-run -n N");
  parse_whole("-g", x.g, 1, 1, "one device per rank: launch one process per GPU with tinyddp-run -n N");
  for (const auto& u : x.unsupported)
    if (u.value != "0") {
      std::string flag = std::string(u.names).substr(0, 2);
      throw UsageError(flag + " " + u.value + ": " + u.what + " is an NCCL-tests feature tinyddp does not have; only " +
                       flag + " 0 is accepted");
    }
}

void check_operation(const FlagTexts& x, PerfOptions& o) {
  o.types = parse_types(x.d);
  o.ops = parse_ops(x.o);
  if (x.r == "all") {
    o.all_roots = true;
  } else {
    o.root = int(parse_whole("-r", x.r, 0, std::numeric_limits<int>::max(), "a rank, or all"));
  }
}

void check_ours(const FlagTexts& x, PerfOptions& o, const PerfCollective& collective) {
  if (x.backend == "ring")
    throw UsageError(
        "--backend: 'ring' is not a backend; the backend is called 'host' now; 'ring' is one of its "
        "algorithms (--algo ring, or TINYDDP_ALGO=ring)");
  const auto backends = comm::available_backends();
  if (std::find(backends.begin(), backends.end(), x.backend) == backends.end())
    throw UsageError("--backend: '" + x.backend + "' is not a backend of this build; it has " + join(backends) +
                     (x.backend == "nccl" ? " (nccl needs CUDA and NCCL at build time: cmake -DTINYDDP_NCCL=ON)" : ""));
  o.backend = x.backend;
  if (x.transport != "auto" && x.transport != "tcp" && x.transport != "shm")
    throw UsageError("--transport: '" + x.transport + "' is not a transport; use tcp, shm or auto");
  if (o.backend != "host" && x.transport != "auto")
    throw UsageError("--transport " + x.transport +
                     " applies to the host backend; NCCL picks its own transports "
                     "(see NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, NCCL_SOCKET_IFNAME)");
  o.transport = x.transport;
  check_algorithm(x.algo, o.backend, collective);
  o.algo = x.algo;
  if (!x.device.empty() && x.device != "cpu" && x.device != "cuda" && x.device.rfind("cuda:", 0) != 0)
    throw UsageError("--device: '" + x.device + "' is not a device; use cpu, cuda or cuda:N");
  if (o.registration == 2 && (o.backend != "host" || (!x.device.empty() && x.device != "cpu")))
    throw UsageError(
        "-R 2: symmetric buffers are host memory, for the host backend on the cpu device; drop -R 2 with "
        "--backend " +
        o.backend + (x.device.empty() ? "" : " --device " + x.device));
  if (o.backend == "nccl" && x.device == "cpu")
    throw UsageError(
        "--device cpu with --backend nccl: NCCL moves CUDA tensors only; use --backend host for CPU tensors");
  o.device = x.device;
  o.rewrite = parse_whole("--rewrite", x.rewrite, 0, 1, "0 leaves the input as the last call left it, 1 rewrites it") ==
              1;
  if (o.rewrite && !o.blocking)
    throw UsageError("--rewrite 1 writes the input before each call, which needs each call done first: add -z 1");
  if (o.rewrite && (o.backend != "host" || (!x.device.empty() && x.device != "cpu")))
    throw UsageError("--rewrite 1 writes host memory: use it with --backend host on the cpu device");
  if (x.init_method != "env://" && x.init_method.rfind("tcp://", 0) != 0)
    throw UsageError("--init-method: '" + x.init_method + "' is neither env:// nor tcp://host:port");
  o.init_method = x.init_method;
  if (!x.J.empty() && (x.J.size() < 5 || x.J.substr(x.J.size() - 5) != ".json"))
    throw UsageError("-J: '" + x.J + "' does not end in .json, the one format nccl-tests' -J writes");
  o.json_file = x.J;
  o.csv_file = x.csv;
}

std::string help_footer(const PerfCollective& collective) {
  return "\nbusbw = algbw x " + collective.bus_factor_formula() +
         " for n ranks (nccl-tests' doc/PERFORMANCE.md).\n"
         "Run one process per rank under a launcher, for example:\n"
         "  tinyddp-run -n 4 " +
         collective.program() +
         " -b 8 -e 128M -f 2\n"
         "Exit status: 0 all results exact, 1 a wrong result or a failure, 2 a usage error.\n";
}

}  // namespace

size_t parse_size(const std::string& flag, const std::string& text) {
  const std::string bad = flag + ": '" + text + "' is not a size (examples: 8, 64K, 1M)";
  const char* begin = text.c_str();
  char* end = nullptr;
  double value = std::strtod(begin, &end);
  if (end == begin || !(value >= 0) || text.find_first_of("xXpP") != std::string::npos) throw UsageError(bad);
  std::string unit(end);
  double scale = 0;
  for (auto [names, bytes] : {std::pair<const char*, double>{",B", 1},
                              {"K,k,KB,kB,KiB", 1024.0},
                              {"M,m,MB,MiB", 1048576.0},
                              {"G,g,GB,GiB", 1073741824.0}}) {
    std::string list = std::string(",") + names + ",";
    if (list.find("," + unit + ",") != std::string::npos) scale = bytes;
  }
  if (scale == 0) throw UsageError(bad);
  double bytes = std::floor(value * scale);
  if (bytes > double(size_t(1) << 50)) throw UsageError(flag + ": '" + text + "' is beyond any buffer (at most 1024T)");
  return size_t(bytes);
}

const char* nccl_type_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "half";
  }
  return "?";
}

std::vector<size_t> PerfOptions::sizes(size_t limit) const {
  std::vector<size_t> rows;
  for (size_t s = min_bytes; s <= max_bytes && rows.size() < limit;) {
    rows.push_back(s);
    size_t next = step_factor > 1 ? s * step_factor : s + step_bytes;
    if (next <= s) break;
    s = next;
  }
  return rows;
}

std::optional<PerfOptions> parse_perf_options(int argc, char** argv, const PerfCollective& collective) {
  PerfOptions o;
  o.program = std::string(argv[0]).substr(std::string(argv[0]).find_last_of('/') + 1);
  o.argv.assign(argv, argv + argc);
  CLI::App app{o.program + ": tinyddp " + collective.name() +
                   " bandwidth and latency, nccl-tests' flags, table and JSON",
               o.program};
  app.footer(help_footer(collective));
  FlagTexts x;
  add_flags(app, x, collective);
  command_line::add_version(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::CallForVersion& version) {
    std::cout << version.what() << "\n";
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    throw UsageError(std::string(e.what()) + "; run with --help for the flags");
  }
  check_sizes(x, o);
  check_timing(x, o);
  check_operation(x, o);
  check_ours(x, o, collective);
  return o;
}

}  // namespace tinyddp::bench
