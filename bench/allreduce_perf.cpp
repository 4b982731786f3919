// allreduce_perf: all-reduce bandwidth and latency, with nccl-tests' flags and table.
//
//   tinyddp-run -n 2 build/bin/allreduce_perf -b 1K -e 256M -f 4 --transport shm
//   mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 build/bin/allreduce_perf ...
//   srun -n 2 build/bin/allreduce_perf ...           (MASTER_ADDR/MASTER_PORT exported)
//
// For each size it times `-n` all-reduces after `-w` warm-up ones, out of place (output != input)
// and in place, and prints time, algbw = bytes / time and busbw = algbw * 2(n-1)/n: the bytes every
// rank must send and receive in a bandwidth-optimal all-reduce, so busbw compares across world
// sizes and with the link's speed. The inputs are chosen so the exact result is known (small
// integers, +-1 and 2 for prod): #wrong counts every element, on every rank, that differs from it.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

#include "comm/process_group.h"
#include "comm/store/hash_store.h"
#include "comm/store/rendezvous.h"
#include "core/cuda_runtime.h"
#include "core/tensor.h"

using namespace tinyddp;
using namespace tinyddp::comm;

namespace {

using Clock = std::chrono::steady_clock;

size_t parse_size(const std::string& text) {
  size_t end = 0;
  double value = std::stod(text, &end);
  std::string unit = text.substr(end);
  double scale = 1;
  if (unit == "K" || unit == "k" || unit == "KB" || unit == "KiB") scale = 1 << 10;
  else if (unit == "M" || unit == "m" || unit == "MB" || unit == "MiB") scale = 1 << 20;
  else if (unit == "G" || unit == "g" || unit == "GB" || unit == "GiB") scale = double(1u << 30);
  else if (!unit.empty() && unit != "B") throw std::runtime_error("size '" + text + "': unknown unit (use K, M or G)");
  return size_t(value * scale);
}

// nccl-tests' type names.
DType parse_type(const std::string& name) {
  if (name == "float" || name == "float32" || name == "f32") return DType::f32;
  if (name == "double" || name == "float64" || name == "f64") return DType::f64;
  if (name == "int32" || name == "int" || name == "i32") return DType::i32;
  if (name == "int64" || name == "i64") return DType::i64;
  throw std::runtime_error("datatype '" + name + "': use float, double, int32 or int64");
}
const char* type_name(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    default: return "?";
  }
}

// Rank r's input at element i, and the exact result of reducing it over `world` ranks.
double input_value(ReduceOp op, int r, size_t i) {
  switch (op) {
    case ReduceOp::prod: return (r + i) % 3 == 0 ? 2.0 : ((r + i) % 3 == 1 ? -1.0 : 1.0);
    case ReduceOp::max:
    case ReduceOp::min: return double(int64_t((r * 37 + i * 11) % 101) - 50);
    default: return double(r + 1 + int(i % 5));
  }
}

template <typename T>
void fill(Tensor& t, ReduceOp op, int rank) {
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = T(input_value(op, rank, size_t(i)));
}

template <typename T>
int64_t count_wrong(const Tensor& t, ReduceOp op, int world) {
  const T* p = t.data<T>();
  int64_t wrong = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    T want = T(input_value(op, 0, size_t(i)));
    for (int r = 1; r < world; ++r) {
      T x = T(input_value(op, r, size_t(i)));
      if (op == ReduceOp::sum || op == ReduceOp::avg) want = T(want + x);
      else if (op == ReduceOp::prod) want = T(want * x);
      else if (op == ReduceOp::max) want = std::max(want, x);
      else want = std::min(want, x);
    }
    if (op == ReduceOp::avg) want = T(want / T(world));
    wrong += p[i] != want;
  }
  return wrong;
}

struct Row {
  size_t bytes, count;
  std::string type, op;
  double time_us[2], algbw[2], busbw[2];
  int64_t wrong[2];  // -1: not checked
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"allreduce_perf: tinyddp all-reduce bandwidth, nccl-tests compatible"};
  std::string min_text = "32M", max_text = "32M", type_text = "float", op_text = "sum";
  double factor = 2;
  int iters = 20, warmup = 5, check = 1, blocking = 0;
  std::string backend = "ring", transport = "auto", json_path, csv_path, init_method = "env://", device_text;
  app.add_option("-b,--minbytes", min_text, "smallest size (K, M, G suffixes)");
  app.add_option("-e,--maxbytes", max_text, "largest size");
  app.add_option("-f,--stepfactor", factor, "multiply the size by this between rows");
  app.add_option("-n,--iters", iters, "timed iterations per size");
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations first");
  app.add_option("-c,--check", check, "check the results (1) or not (0)");
  app.add_option("-z,--blocking", blocking, "wait for each all-reduce before the next (1), as MPI_Allreduce does, or launch them all and wait for the last (0)");
  app.add_option("-d,--datatype", type_text, "float, double, int32, int64");
  app.add_option("-o,--op", op_text, "sum, prod, max, min, avg");
  app.add_option("--backend", backend, "ring or nccl");
  app.add_option("--transport", transport, "ring backend: tcp, shm or auto");
  app.add_option("--device", device_text, "cpu or cuda (default: cpu for ring, cuda for nccl)");
  app.add_option("--init-method", init_method, "env:// (launchers) or tcp://host:port");
  app.add_option("--json", json_path, "also write the rows as JSON");
  app.add_option("--csv", csv_path, "also write the rows as CSV");
  CLI11_PARSE(app, argc, argv);

  try {
    const size_t min_bytes = parse_size(min_text), max_bytes = parse_size(max_text);
    const DType dtype = parse_type(type_text);
    const ReduceOp op = reduce_op_from_name(op_text);
    TINYDDP_CHECK(factor > 1 && min_bytes <= max_bytes && iters > 0 && warmup >= 0, "allreduce_perf: need -f > 1, -b <= -e, -n > 0",
                  "; hint: for example -b 8 -e 128M -f 2 -n 20 -w 5");

    // A launcher (tinyddp-run, torchrun, srun, mpirun) gives rank and world; alone, world size 1.
    Rendezvous rv;
    if (init_method != "env://" || read_launch_environment().rank >= 0) {
      rv = rendezvous(init_method);
    } else {
      rv.store = std::make_shared<HashStore>();
    }
    const int rank = rv.rank, world = rv.world_size;
    Device device = device_text.empty() ? (backend == "nccl" ? Device::cuda(rv.local_rank) : Device::cpu())
                                        : Device::parse(device_text);
    if (device.is_cuda() && device_text == "cuda") device = Device::cuda(rv.local_rank);
    ProcessGroupOptions options;
    options.transport = transport;
    auto pg = create_process_group(backend, rv.store, rank, world, options);

    if (rank == 0) {
      std::printf("# tinyddp allreduce_perf: backend %s, transport %s, device %s, world %d\n", backend.c_str(),
                  transport.c_str(), device.str().c_str(), world);
      std::printf("# minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d validation: %d blocking: %d\n",
                  min_bytes, max_bytes, factor, warmup, iters, check, blocking);
      std::printf("#\n# Using devices\n");
    }
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    // Every rank's line, in rank order, through rank 0 (the store carries them).
    rv.store->set("allreduce_perf/rank/" + std::to_string(rank),
                  "#  Rank " + std::to_string(rank) + " Pid " + std::to_string(getpid()) + " on " + host + " device " +
                      device.str());
    if (rank == 0)
      for (int r = 0; r < world; ++r) std::printf("%s\n", rv.store->get("allreduce_perf/rank/" + std::to_string(r)).c_str());

    const size_t elem = dtype_size(dtype);
    const int64_t max_count = int64_t(max_bytes / elem);
    Tensor input = Tensor::empty({std::max<int64_t>(max_count, 1)}, dtype, device);
    Tensor output = Tensor::empty({std::max<int64_t>(max_count, 1)}, dtype, device);
    {
      // Written once before anything is timed, as nccl-tests does: memory that was never written
      // reads as the kernel's one shared zero page, which is always in cache, and an untouched
      // input made large out-of-place rows look faster than any real buffer can be.
      Tensor pattern = Tensor::empty(input.shape(), dtype);
      dispatch_dtype(dtype, [&](auto zero) { fill<decltype(zero)>(pattern, op, rank); });
      input.copy_from(pattern);
      output.copy_from(pattern);
    }
    Tensor timing = Tensor::zeros({2}, DType::f64);
    Tensor wrong_total = Tensor::zeros({1}, DType::i64);

    if (rank == 0) {
      std::printf("#\n#%92s%37s\n", "out-of-place", "in-place");
      std::printf("#%12s%14s%9s%7s%6s%11s%8s%8s%7s%11s%8s%8s%7s\n", "size", "count", "type", "redop", "root", "time", "algbw",
                  "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
      std::printf("#%12s%14s%9s%7s%6s%11s%8s%8s%7s%11s%8s%8s%7s\n", "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)",
                  "", "(us)", "(GB/s)", "(GB/s)", "");
    }
    std::vector<Row> rows;
    double busbw_sum = 0;
    int64_t wrong_sum = 0;
    std::vector<size_t> sizes;
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes = std::max(bytes + 1, size_t(std::llround(double(bytes) * factor))))
      sizes.push_back(bytes);
    for (size_t bytes : sizes) {
      const int64_t count = int64_t(bytes / elem);
      Tensor in = input.view(0, {count}), out = output.view(0, {count});
      Row row{size_t(count) * elem, size_t(count), type_name(dtype), op_text, {}, {}, {}, {-1, -1}};
      for (int in_place = 0; in_place < 2; ++in_place) {
        auto one = [&] { return in_place ? pg->all_reduce(out, op) : pg->all_reduce_into(out, in, op); };
        for (int i = 0; i < warmup; ++i) one()->wait();
        pg->barrier()->wait();
        auto start = Clock::now();
        // Launched back to back and awaited at the end, as nccl-tests does on its stream: the
        // communication thread runs them in order.
        // With -z 1 each one is awaited before the next is called: the latency a synchronous caller
        // sees, and what a blocking MPI_Allreduce loop measures.
        std::vector<WorkPtr> works;
        for (int i = 0; i < iters; ++i) {
          works.push_back(one());
          if (blocking) works.back()->wait();
        }
        works.back()->wait();  // they run in order: the last done means all done
        for (auto& w : works) w->wait();
        double seconds = std::chrono::duration<double>(Clock::now() - start).count() / iters;
        // The slowest rank's time is the collective's time.
        timing.data<double>()[0] = seconds;
        pg->all_reduce(timing, ReduceOp::max)->wait();
        seconds = timing.data<double>()[0];
        row.time_us[in_place] = seconds * 1e6;
        row.algbw[in_place] = double(row.bytes) / seconds / 1e9;
        row.busbw[in_place] = row.algbw[in_place] * 2.0 * (world - 1) / world;
        if (check) {
          Tensor host_in = Tensor::empty({count}, dtype), host_out;
          dispatch_dtype(dtype, [&](auto zero) { fill<decltype(zero)>(host_in, op, rank); });
          in.copy_from(host_in);
          if (in_place) out.copy_from(host_in);
          (in_place ? pg->all_reduce(out, op) : pg->all_reduce_into(out, in, op))->wait();
          host_out = out.device().is_cpu() ? out : out.to(Device::cpu());
          int64_t wrong = 0;
          dispatch_dtype(dtype, [&](auto zero) { wrong = count_wrong<decltype(zero)>(host_out, op, world); });
          wrong_total.data<int64_t>()[0] = wrong;
          pg->all_reduce(wrong_total, ReduceOp::sum)->wait();
          row.wrong[in_place] = wrong_total.data<int64_t>()[0];
          wrong_sum += row.wrong[in_place];
        }
      }
      busbw_sum += row.busbw[1];
      if (rank == 0) {
        auto wrong_text = [&](int k) { return row.wrong[k] < 0 ? std::string("N/A") : std::to_string(row.wrong[k]); };
        std::printf(" %12zu%14zu%9s%7s%6d%11.1f%8.3f%8.3f%7s%11.1f%8.3f%8.3f%7s\n", row.bytes, row.count, row.type.c_str(),
                    row.op.c_str(), -1, row.time_us[0], row.algbw[0], row.busbw[0], wrong_text(0).c_str(), row.time_us[1],
                    row.algbw[1], row.busbw[1], wrong_text(1).c_str());
        std::fflush(stdout);
      }
      rows.push_back(row);
    }
    pg->barrier()->wait();
    if (rank == 0) {
      std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong_sum), wrong_sum == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %g \n#\n", rows.empty() ? 0.0 : busbw_sum / double(rows.size()));
      if (!json_path.empty()) {
        nlohmann::json doc = {{"backend", backend}, {"transport", transport}, {"world", world}, {"device", device.str()}};
        for (const Row& r : rows)
          doc["rows"].push_back({{"bytes", r.bytes}, {"count", r.count}, {"type", r.type}, {"redop", r.op},
                                 {"oop_time_us", r.time_us[0]}, {"oop_algbw", r.algbw[0]}, {"oop_busbw", r.busbw[0]},
                                 {"oop_wrong", r.wrong[0]}, {"ip_time_us", r.time_us[1]}, {"ip_algbw", r.algbw[1]},
                                 {"ip_busbw", r.busbw[1]}, {"ip_wrong", r.wrong[1]}});
        std::ofstream(json_path) << doc.dump(2) << "\n";
      }
      if (!csv_path.empty()) {
        std::ofstream csv(csv_path);
        csv << "backend,transport,world,bytes,count,type,redop,oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,"
               "ip_busbw,ip_wrong\n";
        for (const Row& r : rows)
          csv << backend << "," << transport << "," << world << "," << r.bytes << "," << r.count << "," << r.type << ","
              << r.op << "," << r.time_us[0] << "," << r.algbw[0] << "," << r.busbw[0] << "," << r.wrong[0] << ","
              << r.time_us[1] << "," << r.algbw[1] << "," << r.busbw[1] << "," << r.wrong[1] << "\n";
      }
    }
    return wrong_sum == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_perf: %s\n", e.what());
    return 2;
  }
}
