// collective_model: what the α-β-γ model (comm/algorithms/cost_model.h) predicts for each all-reduce
// algorithm on a host layout, and the bytes each sends across hosts. bench/compare_cluster.sh sets
// its predictions beside the measured times and the interfaces' byte counters; docs/cluster-network.md
// uses it to extrapolate to many ranks.
//
//   collective_model --hosts 2 --per-host 2 --model tuning.txt -b 4K -e 64M -f 4
//   collective_model --hosts 1024 --alpha-us 5 --gbit 25 -b 4K -e 1G -f 16
//   collective_model --hosts 4 --model measured.txt --call-us 150 -b 1K -e 64K
//     (every prediction includes the model's per-call term, call_us; --call-us replaces it)
//   collective_model --ranks 64,256,1024 --per-host 8 --alpha-us 5 --gbit 25 -b 4K -e 256M -f 16
//     (--ranks: one markdown table, µs per algorithm and auto's pick, for each world size: the
//     extrapolation table of docs/cluster-network.md)
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tinyddp/comm/algorithms/algorithm_selection.h"
#include "tinyddp/comm/algorithms/cost_model.h"

using namespace tinyddp::comm;

namespace {

// The algorithm whose traffic is counted: the hierarchical one with the cross-host step it would choose.
Traffic traffic_of(AllReduceAlgorithm a, const AllReduceSelector& selector, double bytes) {
  const AllReduceAlgorithm across = a == AllReduceAlgorithm::hierarchical ? selector.choose_across_hosts(size_t(bytes))
                                                                          : AllReduceAlgorithm::ring;
  return all_reduce_traffic(a, selector.layout(), bytes, across);
}

// Predicted time and cross-host bytes per algorithm, one row per size.
void print_table(const CostModel& model, const std::vector<AllReduceAlgorithm>& list, int hosts, int per_host,
                 const std::vector<double>& sizes) {
  const AllReduceSelector selector(AllReduceAlgorithm::automatic, model, HostLayout::uniform(hosts, per_host), 0);
  std::printf("# %d hosts x %d ranks; model:\n", hosts, per_host);
  std::istringstream model_lines(model.to_text());
  for (std::string line; std::getline(model_lines, line);) std::printf("#   %s\n", line.c_str());
  std::printf("# predicted time (us) and bytes sent across hosts (all hosts together) per all-reduce\n%12s", "bytes");
  for (AllReduceAlgorithm a : list) std::printf(" %14s_us %12s_xB", algorithm_name(a), algorithm_name(a));
  std::printf(" %14s\n", "auto");
  for (double bytes : sizes) {
    std::printf("%12.0f", bytes);
    for (AllReduceAlgorithm a : list) {
      const Traffic t = traffic_of(a, selector, bytes);
      std::printf(" %17.1f %15.0f", predicted_seconds(model, t) * 1e6, t.total_cross_host_bytes());
    }
    std::printf(" %14s\n", algorithm_name(selector.choose(size_t(bytes))));
  }
}

std::string size_name(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (bytes >= 1024 && u < 3) bytes /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof text, "%g %s", bytes, units[u]);
  return text;
}

// One markdown table for several world sizes of `per_host` ranks per host: µs per algorithm, auto's pick.
void print_markdown(const CostModel& model, const std::vector<AllReduceAlgorithm>& list, const std::vector<int>& worlds,
                    int per_host, const std::vector<double>& sizes) {
  std::printf("| ranks | S |");
  for (AllReduceAlgorithm a : list) std::printf(" %s |", algorithm_name(a));
  std::printf(" auto picks |\n|---|---|");
  for (size_t i = 0; i < list.size(); ++i) std::printf("---|");
  std::printf("---|\n");
  for (int world : worlds) {
    if (world % per_host != 0)
      throw std::runtime_error("--ranks " + std::to_string(world) + " is not a multiple of --per-host");
    const AllReduceSelector selector(AllReduceAlgorithm::automatic, model,
                                     HostLayout::uniform(world / per_host, per_host), 0);
    for (double bytes : sizes) {
      std::printf("| %d | %s |", world, size_name(bytes).c_str());
      for (AllReduceAlgorithm a : list)
        std::printf(" %.0f |", predicted_seconds(model, traffic_of(a, selector, bytes)) * 1e6);
      std::printf(" %s |\n", algorithm_name(selector.choose(size_t(bytes))));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"collective_model: the cost model's predicted all-reduce times and cross-host bytes per algorithm"};
  int hosts = 4, per_host = 1;
  std::string model_file, algos = "ring,direct,rd,rabenseifner,hier";
  size_t begin = 4 << 10, end = 64 << 20;
  double factor = 4, alpha_us = 0, gbit = 0, reduce_gbyte = 0, call_us = -1;
  app.add_option("--hosts", hosts, "hosts")->check(CLI::Range(1, 1 << 20));
  app.add_option("--per-host", per_host, "ranks per host")->check(CLI::Range(1, 1024));
  app.add_option("--model", model_file, "a cost model file (cost_model.h's keys); default: the built-in model");
  app.add_option("--alpha-us", alpha_us, "override: latency of a step across hosts, µs");
  app.add_option("--gbit", gbit, "override: each host's link, Gbit/s");
  app.add_option("--reduce-gbyte", reduce_gbyte, "override: reduction speed, GB/s");
  app.add_option("--call-us", call_us, "override: fixed cost of one call, µs (0 allowed)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("-b", begin, "smallest size per rank (K, M, G suffixes: powers of 1024)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("-e", end, "largest size per rank")->transform(CLI::AsSizeValue(false));
  app.add_option("-f", factor, "size step factor")->check(CLI::Range(1.01, 1e6));
  app.add_option("--algos", algos, "comma-separated algorithms");
  std::vector<int> ranks;
  app.add_option("--ranks", ranks,
                 "world sizes (comma-separated): one markdown table for all, --per-host ranks per host")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 24));
  CLI11_PARSE(app, argc, argv);
  try {
    CostModel model;
    if (!model_file.empty()) {
      std::ifstream in(model_file);
      if (!in) throw std::runtime_error("cannot read --model " + model_file);
      std::stringstream text;
      text << in.rdbuf();
      model = CostModel::parse(text.str(), model_file);
    }
    if (alpha_us > 0) model.alpha_network_s = alpha_us * 1e-6;
    if (gbit > 0) model.network_bytes_per_s = gbit * 1e9 / 8;
    if (reduce_gbyte > 0) model.reduce_bytes_per_s = reduce_gbyte * 1e9;
    if (call_us >= 0) model.call_s = call_us * 1e-6;
    std::vector<AllReduceAlgorithm> list;
    std::stringstream names(algos);
    for (std::string name; std::getline(names, name, ',');) {
      AllReduceAlgorithm a = algorithm_from_name(name, "--algos");
      if (a == AllReduceAlgorithm::hierarchical && per_host == 1) continue;
      list.push_back(a);
    }
    std::vector<double> sizes;
    for (double bytes = double(begin); bytes <= double(end); bytes *= factor) sizes.push_back(bytes);
    if (ranks.empty())
      print_table(model, list, hosts, per_host, sizes);
    else
      print_markdown(model, list, ranks, per_host, sizes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collective_model: %s\n", e.what());
    return 2;
  }
}
