// gemm_bench: GFLOP/s of one CPU core's GEMM through each library tinyddp can use, side by side, and
// oneDNN's bf16 GEMM beside its fp32 one. The shapes are the reference product and the GEMMs
// of the 784-1024-1024-10 MLP step at batch 256 (train_bench's model), in the transposes Linear uses.
//
//   build/bin/gemm_bench                    # one thread, 3 rounds, each library in turn within a round
//   build/bin/gemm_bench --threads 2 --rounds 5
//   build/bin/gemm_bench --choice           # only which library tinyddp chooses here, and why
//
// Each figure is the median over the rounds; within a round every library runs the same shape one
// after another, so a neighbour's load on a shared machine falls on all of them alike.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tinyddp/core/command_line.h"
#include "tinyddp/core/half_precision.h"
#include "tinyddp/core/random.h"
#include "tinyddp/core/tensor.h"
#include "tinyddp/kernels/cpu_gemm.h"
#include "tinyddp/kernels/ops.h"

#ifdef TINYDDP_WITH_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#endif

using namespace tinyddp;
using Clock = std::chrono::steady_clock;

namespace {

struct Shape3 {
  const char* what;
  int64_t m, n, k;
  bool transpose_a, transpose_b;
};

const std::vector<Shape3> kShapes = {
    {"sgemm 256x1024x1024, the reference product", 256, 1024, 1024, false, false},
    {"layer 0 forward   y = x W^T", 256, 1024, 784, false, true},
    {"layer 0 weight grad dW = dy^T x", 1024, 784, 256, true, false},
    {"layer 1 forward   y = x W^T", 256, 1024, 1024, false, true},
    {"layer 1 input grad  dx = dy W", 256, 1024, 1024, false, false},
};

// Calls `run` until `seconds` have passed (at least 3 times, after one warm-up call); returns GFLOP/s.
double gflops(const std::function<void()>& run, double flop, double seconds) {
  run();
  int64_t calls = 0;
  auto start = Clock::now();
  double elapsed = 0;
  while (calls < 3 || elapsed < seconds) {
    run();
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return flop * double(calls) / elapsed / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One way of computing a shape's product: a name and a function that sets it up and returns the call.
struct Contender {
  std::string name;
  std::function<std::function<void()>(const Shape3&)> prepare;  // an empty function: not available
};

// tinyddp's own kernels::gemm with the given CPU library.
Contender library_contender(kernels::CpuGemm gemm) {
  return {std::string(kernels::cpu_gemm_name(gemm)) + " fp32 (kernels::gemm)", [gemm](const Shape3& s) {
            Generator gen(1);
            Tensor a = Tensor::empty(s.transpose_a ? Shape{s.k, s.m} : Shape{s.m, s.k});
            Tensor b = Tensor::empty(s.transpose_b ? Shape{s.n, s.k} : Shape{s.k, s.n});
            Tensor c = Tensor::zeros({s.m, s.n});
            fill_uniform(a, -1.f, 1.f, gen);
            fill_uniform(b, -1.f, 1.f, gen);
            return std::function<void()>([=]() mutable {
              kernels::set_cpu_gemm(gemm);
              kernels::gemm(a, s.transpose_a, b, s.transpose_b, c);
            });
          }};
}

// tinyddp's own kernels::gemm on bf16 tensors: what Linear calls under --precision bf16 (oneDNN's
// bf16 matmul where this CPU has bf16 units, else the rounded operands through the f32 GEMM). With
// `round_b`, each call first rounds b from its f32 copy: the pass Linear makes once a step for its
// weight, shared by forward and dx.
Contender mixed_contender(kernels::CpuGemm chosen, bool round_b = false) {
  return {round_b ? "the same, b rounded from f32 each call" : "tinyddp bf16 (kernels::gemm)",
          [chosen, round_b](const Shape3& s) {
            Generator gen(1);
            Tensor a32 = Tensor::empty(s.transpose_a ? Shape{s.k, s.m} : Shape{s.m, s.k});
            Tensor b32 = Tensor::empty(s.transpose_b ? Shape{s.n, s.k} : Shape{s.k, s.n});
            fill_uniform(a32, -1.f, 1.f, gen);
            fill_uniform(b32, -1.f, 1.f, gen);
            Tensor a = Tensor::empty(a32.shape(), DType::bf16), b = Tensor::empty(b32.shape(), DType::bf16);
            kernels::round_to(a32, DType::bf16, a);
            kernels::round_to(b32, DType::bf16, b);
            Tensor c = Tensor::zeros({s.m, s.n});
            return std::function<void()>([=]() mutable {
              kernels::set_cpu_gemm(chosen);  // the rounded path's f32 GEMM, where it is taken
              if (round_b) kernels::round_to(b32, DType::bf16, b);
              kernels::gemm(a, s.transpose_a, b, s.transpose_b, c);
            });
          }};
}

#ifdef TINYDDP_WITH_ONEDNN
// bf16 from f32 by rounding to nearest even (what PyTorch's .to(torch.bfloat16) does).
uint16_t to_bf16(float value) { return bf16_bits_from_f32(value); }

// oneDNN's matmul primitive, src and weights of `type`, the output f32 (the bf16 GEMM a bf16 training
// step would use: products accumulated in f32). Returns an empty function where this CPU has no
// implementation of it.
// With `blocked_b`, op(b) is described as format_tag::any and kept in the layout the primitive asks for
// (what a weight reordered once per step and used by every GEMM of the step would cost). With
// `reorder_b` as well, each call first reorders b from a plain f32 copy into that layout: what a
// training step would pay per product if it kept the weight that way, since the optimizer changes
// the f32 weight every step and forward (W^T) and dx (W) take it in different layouts, so each product
// needs its own reorder (the plain bf16 copy Linear makes today, one rounding pass, serves both).
Contender onednn_matmul_contender(dnnl::memory::data_type type, const char* name, bool blocked_b = false,
                                  bool reorder_b = false) {
  return {name, [type, blocked_b, reorder_b](const Shape3& s) -> std::function<void()> {
            using tag = dnnl::memory::format_tag;
            using dt = dnnl::memory::data_type;
            dnnl::engine engine(dnnl::engine::kind::cpu, 0);
            dnnl::memory::desc a_md({s.m, s.k}, type, s.transpose_a ? tag::ba : tag::ab);
            dnnl::memory::desc b_md({s.k, s.n}, type, blocked_b ? tag::any : s.transpose_b ? tag::ba : tag::ab);
            dnnl::memory::desc c_md({s.m, s.n}, dt::f32, tag::ab);
            dnnl::matmul::primitive_desc pd;
            try {
              pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine);
            } catch (const dnnl::error&) {
              return {};
            }
            auto a = std::make_shared<dnnl::memory>(a_md, engine);
            auto b = std::make_shared<dnnl::memory>(pd.weights_desc(), engine);
            auto c = std::make_shared<dnnl::memory>(c_md, engine);
            Generator gen(1);
            for (auto* m : {a.get(), b.get()}) {
              const int64_t n = int64_t(m->get_desc().get_size() / (type == dt::f32 ? 4 : 2));
              Tensor values = Tensor::empty({n});
              fill_uniform(values, -1.f, 1.f, gen);
              const float* v = values.data<float>();
              if (type == dt::f32) {
                std::memcpy(m->get_data_handle(), v, size_t(n) * 4);
              } else {
                auto* out = static_cast<uint16_t*>(m->get_data_handle());
                for (int64_t i = 0; i < n; ++i) out[i] = to_bf16(v[i]);
              }
            }
            auto stream = std::make_shared<dnnl::stream>(engine);
            auto matmul = std::make_shared<dnnl::matmul>(pd);
            if (reorder_b) {
              dnnl::memory::desc plain_md({s.k, s.n}, dt::f32, s.transpose_b ? tag::ba : tag::ab);
              auto plain = std::make_shared<dnnl::memory>(plain_md, engine);
              Tensor values = Tensor::empty({s.k * s.n});
              fill_uniform(values, -1.f, 1.f, gen);
              std::memcpy(plain->get_data_handle(), values.data<float>(), size_t(s.k * s.n) * 4);
              auto reorder = std::make_shared<dnnl::reorder>(*plain, *b);
              return [=] {
                reorder->execute(*stream, *plain, *b);
                matmul->execute(*stream, {{DNNL_ARG_SRC, *a}, {DNNL_ARG_WEIGHTS, *b}, {DNNL_ARG_DST, *c}});
                stream->wait();
              };
            }
            return [=] {
              matmul->execute(*stream, {{DNNL_ARG_SRC, *a}, {DNNL_ARG_WEIGHTS, *b}, {DNNL_ARG_DST, *c}});
              stream->wait();
            };
          }};
}

#endif

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tinyddp gemm_bench: one core's GEMM through each CPU library, fp32 and bf16"};
  int threads = 1, rounds = 3;
  double seconds = 0.3;
  bool choice_only = false;
  app.add_option("--threads", threads, "threads of every library")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--rounds", rounds, "rounds; each figure is their median")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seconds", seconds, "time per measurement")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--choice", choice_only,
               "print which CPU GEMM library tinyddp chooses on this machine, and why, then exit");
  if (auto code = tinyddp::command_line::parse(app, argc, argv)) return *code;

  try {
    if (choice_only) {
      std::printf("tinyddp's choice here: %s\n", kernels::cpu_gemm_description().c_str());
      return 0;
    }
    kernels::set_cpu_threads(threads);
    const kernels::CpuGemm chosen = kernels::cpu_gemm();
    std::vector<Contender> contenders;
    for (kernels::CpuGemm gemm : kernels::available_cpu_gemms()) contenders.push_back(library_contender(gemm));
#ifdef TINYDDP_WITH_ONEDNN
    omp_set_num_threads(threads);  // the matmul primitive's threads (kernels::gemm sets its own)
    contenders.push_back(onednn_matmul_contender(dnnl::memory::data_type::f32, "oneDNN fp32 (matmul primitive)"));
    contenders.push_back(onednn_matmul_contender(dnnl::memory::data_type::bf16, "oneDNN bf16 in, fp32 out (matmul)"));
    contenders.push_back(
        onednn_matmul_contender(dnnl::memory::data_type::bf16, "oneDNN bf16, b in oneDNN's own layout", true));
    contenders.push_back(
        onednn_matmul_contender(dnnl::memory::data_type::bf16, "the same, b reordered from f32 each call", true, true));
#endif
    contenders.push_back(mixed_contender(chosen));
    contenders.push_back(mixed_contender(chosen, true));
    std::printf("tinyddp gemm_bench, %d thread(s); %s\n", threads, kernels::cpu_gemm_kernels().c_str());
    std::printf("tinyddp's choice here: %s\n", kernels::cpu_gemm_description().c_str());

    for (const Shape3& shape : kShapes) {
      const double flop = 2.0 * double(shape.m) * double(shape.n) * double(shape.k);
      std::printf("\n%s: m=%lld n=%lld k=%lld%s%s  (GFLOP/s, median of %d)\n", shape.what, (long long)shape.m,
                  (long long)shape.n, (long long)shape.k, shape.transpose_a ? " a^T" : "",
                  shape.transpose_b ? " b^T" : "", rounds);
      std::vector<std::function<void()>> calls;
      for (const Contender& c : contenders) calls.push_back(c.prepare(shape));
      std::vector<std::vector<double>> results(contenders.size());
      for (int r = 0; r < rounds; ++r)
        for (size_t i = 0; i < contenders.size(); ++i)
          if (calls[i]) results[i].push_back(gflops(calls[i], flop, seconds));
      for (size_t i = 0; i < contenders.size(); ++i) {
        if (!calls[i])
          std::printf("  %-40s  not implemented on this CPU\n", contenders[i].name.c_str());
        else
          std::printf("  %-40s %7.1f\n", contenders[i].name.c_str(), median(results[i]));
      }
    }
    kernels::set_cpu_gemm(chosen);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
