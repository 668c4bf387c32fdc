// Every storage format's operations on every backend, in the spirit of llama.cpp's test-backend-ops:
// the formats come from the registry (each method that keeps the model's K/V builds its caches on a
// synthetic layer; the shared formats no method builds here are made directly), and each cache's
// decode attention runs on the reference (portable kernels, one softmax over every segment's logits),
// the fast CPU path (dispatched SIMD kernels, online softmax) and CUDA when a GPU is visible. A format
// without a GPU form must be one of the listed gaps, and the CUDA backend must refuse it by name.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <deque>
#include <map>
#include <numeric>
#include <set>

#include "harness/cache/device_form.hpp"
#include "harness/cache/layer_cache.hpp"
#include "harness/cache/lowrank_segment.hpp"
#include "harness/cache/quantized_segment.hpp"
#include "harness/engine/backend.hpp"
#include "harness/engine/rope_freqs.hpp"
#include "harness/method/method.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"

using namespace kvb;
using kvb::test::SyntheticLayer;

namespace {

// A host stand-in for a GPU backend's uploader: keeps copies of what a device form uploads.
class HostUploader final : public DeviceUploader {
 public:
  const float* upload(std::span<const float> x) override { return keep(x); }
  const int32_t* upload(std::span<const int32_t> x) override { return keep(x); }
  const uint32_t* upload(std::span<const uint32_t> x) override { return keep(x); }
  const uint16_t* upload(std::span<const uint16_t> x) override { return keep(x); }
  const float* upload_shared(std::span<const float> x) override { return keep(x); }
  void check_rope(const RopeTable&) override {}
  size_t arrays = 0;

 private:
  template <typename T>
  const T* keep(std::span<const T> x) {
    ++arrays;
    const auto* bytes = static_cast<const unsigned char*>(static_cast<const void*>(x.data()));
    auto& b = store_.emplace_back(bytes, bytes + x.size_bytes());
    return static_cast<const T*>(static_cast<const void*>(b.data()));
  }
  std::deque<std::vector<unsigned char>> store_;
};

std::string family_of(const Segment& s) { return s.format().substr(0, s.format().find('(')); }

// One cache per format family (its name up to '('), the first that holds it, and what built it.
struct FormatCase {
  std::string family, built_by;
  std::unique_ptr<LayerCache> cache;
};

constexpr int kHq = 6, kHkv = 2, kDim = 64;

void add_new_families(std::vector<FormatCase>& cases, const std::string& built_by, std::unique_ptr<LayerCache> cache) {
  std::set<std::string> seen;
  for (const auto& c : cases) seen.insert(c.family);
  // A compressed format rather than the dense tail beside it; "dense" for a cache holding only that.
  std::string family = "dense";
  for (int h = 0; h < cache->n_cache_heads(); ++h)
    for (const auto& seg : cache->segments(h))
      if (const auto f = family_of(*seg); f != "dense" && !seen.count(f) && family == "dense") family = f;
  if (!seen.count(family)) cases.push_back({family, built_by, std::move(cache)});
}

std::vector<FormatCase> format_cases(KvDtype dtype) {
  std::vector<FormatCase> cases;
  const auto& reg = MethodRegistry::get();
  for (const auto& name : reg.names()) {
    if (reg.info(name).changes_model) continue;  // their caches exist only inside an engine's prefill
    for (const char* gqa : {"native", "repeat"}) {
      SyntheticLayer L(300, kHq, kHkv, kDim, 32, 5);
      L.view.kv_dtype = dtype;
      auto m = reg.create(name, test::method_test_params(name, {{"gqa", gqa}}), L.cfg);
      if (m->reads_whole_prompt()) continue;  // decides inside an engine's prefill: dense, like SnapKV's
      MethodRunner runner(*m, m->budgeted() ? KvBudget(64) : KvBudget{});
      auto cache = std::make_unique<LayerCache>(kHq, gqa == std::string("repeat") ? kHq : kHkv, kDim, dtype);
      runner.on_layer(L.view, *cache);
      add_new_families(cases, name, std::move(cache));
    }
  }
  // The shared formats no registered method builds on this layer (MixedDimKV may keep no middle
  // width here; nothing builds plain quantized segments yet), with a dense tail after them.
  const int n = 64;
  const auto k = test::randn(size_t(n) * kDim, 3), v = test::randn(size_t(n) * kDim, 4);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  auto basis = std::make_shared<LowRankBasis>(pca_basis(k.data(), v.data(), n, kDim, kDim / 2));
  auto direct = [&](const std::string& what, auto make) {
    auto cache = std::make_unique<LayerCache>(kHq, kHkv, kDim, dtype);
    for (int h = 0; h < kHkv; ++h) {
      cache->segments(h).push_back(make());
      cache->segments(h).back()->store_as(dtype);
      auto tail = std::make_unique<DenseSegment>(kDim, dtype);
      tail->append_rows(k.data(), v.data(), 7, kDim, pos.data());
      cache->segments(h).push_back(std::move(tail));
    }
    add_new_families(cases, what, std::move(cache));
  };
  direct("LowRankSegment", [&] {
    auto s = std::make_unique<LowRankSegment>(basis, kDim / 4, kDim / 4, true);
    for (int t = 0; t < n; ++t) s->append(k.data() + size_t(t) * kDim, v.data() + size_t(t) * kDim, t);
    return s;
  });
  direct("QuantizedSegment", [&] {
    auto s = std::make_unique<QuantizedSegment>(kDim, 4, 2, 32, 32);
    s->append(k.data(), v.data(), n, pos.data());
    return s;
  });
  return cases;
}

// |x - ref| relative to max |ref|.
double relative_error(const std::vector<float>& x, const std::vector<float>& ref) {
  return test::max_abs_diff(x, ref) / std::max<double>(test::max_abs(ref), 1e-30);
}

}  // namespace

TEST_CASE("every storage format's decode attention on every backend: reference, fast CPU, CUDA or a listed gap",
          "[methods][backends]") {
  // The formats the CUDA backend cannot attend over (yet): a format leaving this list gets a device
  // form beside its CPU code, and this test then requires it. DynaKV's latent segment, built only
  // inside an engine's prefill, has none either.
  const std::set<std::string> gaps = {"kvmix", "kivi", "int8", "rtn", "qjl"};
  const bool gpu_visible = cuda_available();
  std::unique_ptr<Backend> gpu;
  std::vector<std::string> table;
  std::set<std::string> families;
  for (KvDtype dtype : {KvDtype::F32, KvDtype::BF16, KvDtype::F16}) {
    for (auto& fc : format_cases(dtype)) {
      families.insert(fc.family);
      const LayerCache& cache = *fc.cache;
      INFO(fc.family << " built by " << fc.built_by << " at " << kv_dtype_name(dtype));
      const auto q = test::randn(size_t(kHq) * kDim, 11);
      std::vector<float> ref(q.size()), fast(q.size());
      force_portable_kernels(true);
      attend_ref(cache, q.data(), ref.data());
      force_portable_kernels(false);
      attend(cache, q.data(), fast.data());
      const double fast_err = relative_error(fast, ref);
      CHECK(fast_err <= 1e-4);

      bool form = true;  // every non-dense segment has a device form
      for (int h = 0; h < cache.n_cache_heads(); ++h)
        for (const auto& seg : cache.segments(h)) {
          if (family_of(*seg) == "dense") continue;  // the backend's own: the tail decoding appends to
          HostUploader up;
          cuda::DecodeSegment d;
          const bool has = seg->device_form(up, d);
          if (has) {
            CHECK(up.arrays >= 2);  // positions and the stored numbers at least
            CHECK(d.pos != nullptr);
          }
          form = form && has;
        }
      CHECK(form == !gaps.count(fc.family));

      std::string cuda_cell = form ? "no GPU" : "gap";
      if (gpu_visible) {
        if (!gpu) {
          gpu = make_cuda_backend();
          SyntheticLayer shape(2, kHq, kHkv, kDim, 1, 0);
          gpu->set_rope(rope_inv_freq(shape.cfg), false);
        }
        Buffer qb = test::to_buffer(*gpu, q), ob(*gpu, q.size());
        if (form) {
          gpu->attention_decode(cache, qb, ob);
          const double err = relative_error(test::from_buffer(*gpu, ob), ref);
          CHECK(err <= 1e-4);
          cuda_cell = fmt::format("{:.1e}", err);
        } else {
          CHECK_THROWS_WITH(gpu->attention_decode(cache, qb, ob), Catch::Matchers::Contains("has no GPU form"));
        }
      }
      table.push_back(fmt::format("{:<14} {:<5} {:<22} fast CPU {:.1e}  CUDA {}", fc.family, kv_dtype_name(dtype),
                                  fc.built_by, fast_err, cuda_cell));
    }
  }
  CHECK(families.size() >= 6);
  for (const auto& g : gaps) CHECK(families.count(g));  // a listed gap that is no longer built is stale
  WARN("decode attention against the reference (max error / max |reference|):\n"
       << fmt::format("{}", fmt::join(table, "\n"))
       << "\nwithout a GPU form: " << fmt::format("{}", fmt::join(gaps, ", ")) << ", dynakv-latent");
}
