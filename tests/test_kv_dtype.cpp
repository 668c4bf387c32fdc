// The KV cache's stored dtype (fp32, bf16, fp16): the row kernels against their references, segments
// charged and read at the dtype, the engine and the method runner storing every cache at the run's
// dtype (budgets scale with it), and the records' memory fields (kv_dtype, T_eq).
#include <bit>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>

#include "harness/cache/lowrank_segment.hpp"
#include "harness/cache/quantized_segment.hpp"
#include "harness/engine/engine.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "test_util.hpp"

#include <cstring>

using namespace kvb;

namespace {

using test::randn;

std::vector<unsigned char> encoded(KvDtype t, const std::vector<float>& x) {
  std::vector<unsigned char> out(x.size() * kv_dtype_bytes(t));
  kv_encode(t, x.data(), x.size(), out.data());
  return out;
}

}  // namespace

TEST_CASE("KV dtype names, sizes and parse errors", "[kv_dtype]") {
  for (KvDtype t : {KvDtype::F32, KvDtype::BF16, KvDtype::F16}) CHECK(parse_kv_dtype(kv_dtype_name(t), "test") == t);
  CHECK(kv_dtype_bytes(KvDtype::F32) == 4);
  CHECK(kv_dtype_bytes(KvDtype::F16) == 2);
  CHECK(kv_dtype_bytes(KvDtype::BF16) == 2);
  test::require_error([] { parse_kv_dtype("fp8", "spec.yaml: kv_dtype"); },
                      {"spec.yaml: kv_dtype", "'fp8'", "fp32, bf16, fp16"});
}

TEST_CASE("KV rows: encoding rounds to nearest even like the scalar conversions, on every path", "[kv_dtype]") {
  force_portable_kernels(GENERATE(false, true));
  auto x = randn(4099, 1, 3.0f);
  // Edges: subnormal halves, the largest half, overflow to infinity, ties, zeros of both signs.
  for (float e : {6.0e-8f, -3.0e-5f, 65504.0f, 65520.0f, 1e6f, -1e6f, 1.0009765625f, 0.0f, -0.0f,
                  std::numeric_limits<float>::infinity(), 1e-40f, 1.5f})  // the tail ends on a nonzero
    x.push_back(e);
  for (KvDtype t : {KvDtype::F16, KvDtype::BF16}) {
    if (t == KvDtype::F16) {  // finite values past fp16's range are refused (below)
      std::vector<float> in_range;
      for (float v : x)
        if (!std::isfinite(v) || std::abs(v) < 65520.0f) in_range.push_back(v);
      x = in_range;
    }
    const auto got = encoded(t, x);
    const auto* h = reinterpret_cast<const uint16_t*>(got.data());
    std::vector<float> back(x.size());
    kv_decode(t, got.data(), x.size(), back.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t want = t == KvDtype::F16 ? float_to_half(x[i]) : float_to_bf16(x[i]);
      REQUIRE(h[i] == want);
      REQUIRE(std::bit_cast<uint32_t>(back[i]) == std::bit_cast<uint32_t>(kv_round(t, x[i])));
    }
  }
  const auto f = encoded(KvDtype::F32, x);
  CHECK(std::memcmp(f.data(), x.data(), f.size()) == 0);
  // Found by an audit: a key past fp16's range became infinity, attention NaN, and the head's output 0.
  for (float big : {65520.0f, -1e6f}) {
    std::vector<float> row(37, 1.0f);
    row[33] = big;  // past the vector path's blocks of 8
    test::require_error([&] { encoded(KvDtype::F16, row); }, {"past the range of an fp16 KV cache", "--kv-dtype"});
    CHECK(encoded(KvDtype::BF16, row).size() == row.size() * 2);
  }
  CHECK(encoded(KvDtype::F16, {std::numeric_limits<float>::infinity(), 65504.0f}).size() == 4);
  force_portable_kernels(false);
}

TEST_CASE("KV rows: fast products equal their references at every dtype and width", "[kv_dtype]") {
  force_portable_kernels(GENERATE(false, true));
  INFO("vector path: " << (cpu_has_avx2() ? "AVX2/F16C" : "portable"));
  for (KvDtype t : {KvDtype::F32, KvDtype::BF16, KvDtype::F16})
    for (int d : {64, 128, 72, 13, 8})
      for (size_t n : {size_t(0), size_t(1), size_t(37), size_t(300)}) {
        INFO(kv_dtype_name(t) << " d " << d << " n " << n);
        const auto rows = encoded(t, randn(n * d, uint32_t(d * 7 + n)));
        const auto q = randn(size_t(d), 5), p0 = randn(n, 6);
        std::vector<float> p(p0);
        for (size_t i = 0; i < n; i += 5) p[i] = 0.0f;  // skipped rows in the fast path
        std::vector<float> fast(n), ref(n);
        kv_rows_dot(t, rows.data(), n, d, q.data(), fast.data());
        kv_rows_dot_ref(t, rows.data(), n, d, q.data(), ref.data());
        for (size_t i = 0; i < n; ++i) REQUIRE(fast[i] == Approx(ref[i]).epsilon(1e-5).margin(1e-5));
        std::vector<float> acc_fast = randn(size_t(d), 9), acc_ref = acc_fast;
        kv_rows_axpy(t, rows.data(), n, d, p.data(), acc_fast.data());
        kv_rows_axpy_ref(t, rows.data(), n, d, p.data(), acc_ref.data());
        for (int c = 0; c < d; ++c) REQUIRE(acc_fast[c] == Approx(acc_ref[c]).epsilon(1e-5).margin(1e-5));
      }
  force_portable_kernels(false);
}

TEST_CASE("KV rows: a GQA group's products equal each query's own, bit for bit", "[kv_dtype]") {
  force_portable_kernels(GENERATE(false, true));
  INFO("vector path: " << (cpu_has_avx2() ? "AVX2/F16C" : "portable"));
  for (KvDtype t : {KvDtype::F32, KvDtype::BF16, KvDtype::F16})
    for (int d : {64, 128, 72, 13, 24})
      for (size_t n : {size_t(1), size_t(37), size_t(300)})
        for (int g : {1, 2, 3, 4, 7}) {
          INFO(kv_dtype_name(t) << " d " << d << " n " << n << " g " << g);
          const auto rows = encoded(t, randn(n * d, uint32_t(d + n)));
          const auto q = randn(size_t(g) * d, 5);
          auto p = randn(size_t(g) * n, 6);
          for (size_t i = 0; i < p.size(); i += 3) p[i] = 0.0f;  // rows skipped by some queries only
          std::vector<float> group(size_t(g) * n), one(n);
          kv_rows_dot(t, rows.data(), n, d, q.data(), group.data(), g);
          std::vector<float> acc_group = randn(size_t(g) * d, 9), acc_one = acc_group;
          kv_rows_axpy(t, rows.data(), n, d, p.data(), acc_group.data(), g);
          for (int j = 0; j < g; ++j) {
            kv_rows_dot(t, rows.data(), n, d, q.data() + size_t(j) * d, one.data());
            for (size_t i = 0; i < n; ++i) REQUIRE(group[size_t(j) * n + i] == one[i]);
            kv_rows_axpy(t, rows.data(), n, d, p.data() + size_t(j) * n, acc_one.data() + size_t(j) * d);
          }
          REQUIRE(acc_group == acc_one);
          if (!cpu_has_avx512()) continue;
          // the AVX-512 kernels (a whole group per pass) give the AVX2 ones' numbers (pairs per pass)
          std::vector<float> narrow(group.size()), acc_narrow = randn(size_t(g) * d, 9);
          cap_kernels_at_avx2(true);
          kv_rows_dot(t, rows.data(), n, d, q.data(), narrow.data(), g);
          kv_rows_axpy(t, rows.data(), n, d, p.data(), acc_narrow.data(), g);
          cap_kernels_at_avx2(false);
          REQUIRE(narrow == group);
          REQUIRE(acc_narrow == acc_group);
        }
  force_portable_kernels(false);
}

TEST_CASE("ragged rows: the axpy equals its reference, and every kernel path gives the same numbers", "[kv_dtype]") {
  // Widths from 0 to ld, so that rows end inside, at and past the vector blocks; ld not a multiple of 16.
  for (int ld : {192, 70, 5})
    for (int g : {1, 2, 3, 4, 7}) {
      INFO("ld " << ld << " g " << g);
      const size_t n = 41;
      std::vector<uint16_t> widths(n);
      std::mt19937 gen(uint32_t(ld * 10 + g));
      for (auto& w : widths) w = static_cast<uint16_t>(std::uniform_int_distribution<int>(0, ld)(gen));
      size_t total = 0;
      for (auto w : widths) total += w;
      const auto rows = randn(total, uint32_t(ld + g));
      const auto p = randn(size_t(g) * n, 3);
      const auto start = randn(size_t(g) * ld, 4);
      std::vector<float> ref = start;
      ragged_rows_axpy_ref(rows.data(), widths.data(), n, p.data(), g, ref.data(), ld);
      std::vector<std::vector<float>> paths;
      for (int level : {2, 1, 0}) {
        cap_kernels_at_avx2(level == 1);  // first: it resets a forced portable level
        force_portable_kernels(level == 0);
        std::vector<float> got = start;
        ragged_rows_axpy(rows.data(), widths.data(), n, p.data(), g, got.data(), ld);
        for (size_t i = 0; i < got.size(); ++i) REQUIRE(std::abs(got[i] - ref[i]) <= 1e-4f * (1.0f + std::abs(ref[i])));
        paths.push_back(got);
      }
      cap_kernels_at_avx2(false);
      force_portable_kernels(false);
      REQUIRE(paths[0] == paths[1]);
      REQUIRE(paths[1] == paths[2]);
    }
}

TEST_CASE("rows dotted in channel order: every path gives std::inner_product's numbers bit for bit", "[kv_dtype]") {
  // Row counts off the 16-row blocks and the four-block steps, runs starting and ending inside blocks,
  // head dims odd and even, a signed zero (0 + -0 is +0).
  for (size_t n : {1, 7, 16, 41, 200})
    for (int d : {64, 33})
      for (int g : {1, 3, 4, 6}) {
        auto rows = randn(n * size_t(d), uint32_t(n + d));
        const auto q = randn(size_t(g) * d, uint32_t(g), 2.0f);
        std::fill_n(rows.begin(), d, 0.0f);
        rows[0] = -0.0f;
        std::vector<float> blocks;
        for (size_t i = 0; i < n; ++i) append_block_row(blocks, i, d, rows.data() + i * d);
        REQUIRE(blocks.size() == (n + kOrderBlock - 1) / kOrderBlock * kOrderBlock * size_t(d));
        std::vector<float> back(static_cast<size_t>(d));
        row_of_blocks(blocks.data(), n - 1, d, back.data());
        REQUIRE(std::equal(back.begin(), back.end(), rows.begin() + (n - 1) * d));
        for (auto [t0, t1] : {std::pair<size_t, size_t>{0, n}, {n / 3, n - n / 5}}) {
          INFO("n " << n << " d " << d << " g " << g << " rows " << t0 << ".." << t1);
          std::vector<float> ref(size_t(g) * n, -1.0f);
          for (size_t j = 0; j < size_t(g); ++j)
            for (size_t i = t0; i < t1; ++i)
              ref[j * n + i] =
                  std::inner_product(q.begin() + j * d, q.begin() + (j + 1) * d, rows.begin() + i * d, 0.0f);
          for (int level : {2, 1, 0}) {
            cap_kernels_at_avx2(level == 1);  // first: it resets a forced portable level
            force_portable_kernels(level == 0);
            std::vector<float> got(ref.size(), -1.0f);
            blocks_dot_in_order(blocks.data(), t0, t1, d, q.data(), g, got.data(), n);
            for (size_t i = 0; i < got.size(); ++i) {
              REQUIRE(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(ref[i]));
            }
          }
          cap_kernels_at_avx2(false);
          force_portable_kernels(false);
        }
      }
}

TEST_CASE("weighted rows summed in token order: every path gives the reference's numbers bit for bit", "[kv_dtype]") {
  // Head dims with and without the register paths, groups across their runs of 3 and 4, zero weights
  // (skipped or not) over rows with signed zeros and an infinity, weights with a leading dimension past n.
  for (size_t n : {1, 5, 130})
    for (int d : {64, 128, 33})
      for (int g : {1, 2, 3, 4, 5, 7})
        for (bool skip : {false, true}) {
          INFO("n " << n << " d " << d << " g " << g << " skip " << skip);
          auto rows = randn(n * size_t(d), uint32_t(n + d));
          const size_t ldw = n + 3, ldo = size_t(d) + 5;
          auto w = randn(size_t(g) * ldw, uint32_t(g + 7));
          for (size_t i = 0; i < w.size(); i += 4) w[i] = 0.0f;
          std::fill_n(rows.begin(), d, -0.0f);
          if (n > 2) {
            // A row every vector weighs 0 holding an infinity: a NaN in its channel unless it is skipped.
            rows[2 * size_t(d)] = std::numeric_limits<float>::infinity();
            for (int j = 0; j < g; ++j) w[size_t(j) * ldw + 2] = 0.0f;
          }
          std::vector<float> ref(size_t(g) * ldo, -1.0f);
          rows_weighted_in_order_ref(rows.data(), n, d, w.data(), ldw, g, skip, ref.data(), ldo);
          for (int level : {2, 1, 0}) {
            cap_kernels_at_avx2(level == 1);  // first: it resets a forced portable level
            force_portable_kernels(level == 0);
            std::vector<float> got(ref.size(), -1.0f);
            rows_weighted_in_order(rows.data(), n, d, w.data(), ldw, g, skip, got.data(), ldo);
            for (size_t i = 0; i < got.size(); ++i) {
              REQUIRE(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(ref[i]));
            }
          }
          cap_kernels_at_avx2(false);
          force_portable_kernels(false);
        }
}

TEST_CASE("dense segments at 16 bits: half the bytes, the rounded numbers, erase and store_as", "[kv_dtype]") {
  const int d = 64, n = 40;
  const auto k = randn(size_t(n) * d, 11), v = randn(size_t(n) * d, 12), q = randn(d, 13), p = randn(n, 14);
  for (KvDtype t : {KvDtype::F16, KvDtype::BF16}) {
    INFO(kv_dtype_name(t));
    DenseSegment s32(d), s16(d, t), rounded(d);
    std::vector<float> kr(k.size()), vr(v.size());
    for (size_t i = 0; i < k.size(); ++i) {
      kr[i] = kv_round(t, k[i]);
      vr[i] = kv_round(t, v[i]);
    }
    for (int i = 0; i < n; ++i) {
      s32.append(&k[size_t(i) * d], &v[size_t(i) * d], i);
      s16.append(&k[size_t(i) * d], &v[size_t(i) * d], i);
      rounded.append(&kr[size_t(i) * d], &vr[size_t(i) * d], i);
    }
    CHECK(s16.bytes() * 2 == s32.bytes());
    std::vector<float> a(n), b(n);
    s16.logits(q.data(), a.data());
    rounded.logits(q.data(), b.data());
    for (int i = 0; i < n; ++i) CHECK(a[i] == Approx(b[i]).epsilon(1e-5).margin(1e-5));
    std::vector<float> acc_a(d, 0.0f), acc_b(d, 0.0f);
    s16.accumulate(p.data(), acc_a.data());
    rounded.accumulate(p.data(), acc_b.data());
    for (int c = 0; c < d; ++c) CHECK(acc_a[c] == Approx(acc_b[c]).epsilon(1e-5).margin(1e-5));
    // store_as gives the same rows as storing at 16 bits from the start.
    s32.store_as(t);
    CHECK(s32.bytes() == s16.bytes());
    std::vector<float> r1(size_t(n) * d), r2(r1.size());
    s32.read(0, n, r1.data(), nullptr);
    s16.read(0, n, r2.data(), nullptr);
    CHECK(r1 == r2);
    CHECK(r1 == std::vector<float>(kr.begin(), kr.end()));
    s16.erase(3);
    CHECK(s16.size() == size_t(n - 1));
    std::vector<float> row(d);
    s16.read(3, 1, row.data(), nullptr);
    CHECK(std::vector<float>(kr.begin() + 4 * d, kr.begin() + 5 * d) == row);
    test::require_error([&] { (void)s16.k(); }, {"use read()"});
  }
}

TEST_CASE("store_as scales every full-precision format and leaves codes alone", "[kv_dtype]") {
  const int d = 32, n = 33;
  const auto k = randn(size_t(n) * d, 21), v = randn(size_t(n) * d, 22);
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = i;
  auto basis = std::make_shared<const LowRankBasis>(pca_basis(k.data(), v.data(), n, d, 8));
  LayerCache cache(2, 1, d);
  auto low = std::make_unique<LowRankSegment>(basis, 8, 4, true);
  auto quant = std::make_unique<QuantizedSegment>(d, 2, 2);
  auto dense = std::make_unique<DenseSegment>(d);
  for (int i = 0; i < n; ++i) {
    low->append(&k[size_t(i) * d], &v[size_t(i) * d], i);
    dense->append(&k[size_t(i) * d], &v[size_t(i) * d], i);
  }
  quant->append(k.data(), v.data(), 32, pos.data());
  const size_t low32 = low->bytes(), dense32 = dense->bytes(), quant32 = quant->bytes();
  cache.segments(0).push_back(std::move(low));
  cache.segments(0).push_back(std::move(quant));
  cache.segments(0).push_back(std::move(dense));
  cache.store_as(KvDtype::F16);
  CHECK(cache.dtype() == KvDtype::F16);
  const auto& segs = cache.segments(0);
  CHECK(segs[0]->bytes() * 2 == low32);
  CHECK(segs[1]->bytes() == quant32);
  CHECK(segs[2]->bytes() * 2 == dense32);
  // Decoded tokens go to a dense tail at the cache's dtype.
  const auto kn = randn(d, 23);
  cache.append(kn.data(), kn.data(), n);
  CHECK(static_cast<const DenseSegment&>(*cache.segments(0).back()).dtype() == KvDtype::F16);
}

TEST_CASE("the engine and the runner store caches at the run's dtype, budgets scale with it", "[kv_dtype][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  EngineOptions o16;
  o16.kv_dtype = KvDtype::F16;
  Engine e32(*model), e16(*model, o16);
  std::vector<int32_t> ids(120);
  for (int i = 0; i < 120; ++i) ids[i] = 100 + 37 * i;
  const int L = model->config().n_layers;
  e32.prefill(ids);
  e16.prefill(ids);
  CHECK(e16.kv_bytes() * 2 == e32.kv_bytes());
  CHECK(e16.full_kv_bytes(120) == e16.kv_bytes());
  CHECK(equivalent_kv_size(model->config(), e16.kv_bytes()) == Approx(120.0));
  CHECK(equivalent_kv_size(model->config(), e32.kv_bytes()) == Approx(240.0));
  const auto a = e32.decode(500), b = e16.decode(500);
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, double(std::abs(a[i] - b[i])));
  CHECK(std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin());
  CHECK(worst < 0.05);
  CHECK(worst > 0);  // the cache really held rounded numbers

  const auto& reg = MethodRegistry::get();
  for (const char* name : {"snapkv", "mixeddimkv", "kvmix"}) {
    INFO(name);
    auto m = reg.create(name,
                        name == std::string("kvmix") ? std::map<std::string, std::string>{{"layers", "low"}}
                                                     : std::map<std::string, std::string>{},
                        model->config());
    const KvBudget budget = m->budgeted() ? KvBudget(32) : KvBudget{};
    MethodRunner r32(*m, budget), r16(*m, budget);
    e32.prefill(ids, &r32);
    e16.prefill(ids, &r16);
    for (int l = 0; l < L; ++l) CHECK(e16.caches()[size_t(l)].dtype() == KvDtype::F16);
    if (m->budgeted()) {
      CHECK(r16.prefill_kv_bytes() * 2 == r32.prefill_kv_bytes());
      CHECK(r16.prefill_kv_bytes() <= e16.full_kv_bytes(32));
    } else {
      CHECK(r16.prefill_kv_bytes() < r32.prefill_kv_bytes());
    }
    CHECK(e16.kv_bytes() == r16.prefill_kv_bytes());
    e16.decode(500);  // decoding appends at 16 bits
  }
}

TEST_CASE("kv_dtype in specs and records", "[kv_dtype][experiment]") {
  const test::TempDir dir("kv_dtype");
  const auto spec = (dir / "s.yaml").string();
  // The spec loader only checks that the model file exists.
  const std::string model = test::source_path("tests/test_kv_dtype.cpp");
  auto write = [&](const std::string& extra) {
    std::ofstream(spec) << "model: " << model << "\ntask: niah\nmethods: [fullkv]\n" << extra;
  };
  write("");
  CHECK(load_experiment(spec).kv_dtype == KvDtype::F32);
  write("kv_dtype: fp16\n");
  CHECK(load_experiment(spec).kv_dtype == KvDtype::F16);
  write("kv_dtype: int8\n");
  test::require_error([&] { load_experiment(spec); }, {"s.yaml:4", "'int8'", "fp32, bf16, fp16"});
}
