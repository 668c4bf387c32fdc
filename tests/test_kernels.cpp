// Fast CPU kernels against their plain references, on random inputs over several shapes.
#include <bit>
#include <cstring>
#include <limits>
#include <random>
#include <string_view>
#include <utility>

#include <cblas.h>
#include <sys/mman.h>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/backend.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/blas_core.hpp"
#include "kernels/cpu/dequant.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "kernels/cpu/linear_bf16.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/quantize.hpp"
#include "kernels/cpu/sign_dot.hpp"
#include "kernels/cpu/token_codes.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace

namespace {

// Batched decoding's products: n tokens of n sequences through `tokens(x, n, y)` give each row bit for
// bit what the token alone (n = 1) gives.
template <typename Tokens>
void check_tokens_apart(const std::vector<float>& x, int n, int in, int out, Tokens tokens) {
  std::vector<float> together(size_t(n) * out, std::numeric_limits<float>::quiet_NaN()),
      alone(static_cast<size_t>(out));
  tokens(x.data(), n, together.data());
  for (int b = 0; b < n; ++b) {
    tokens(x.data() + size_t(b) * in, 1, alone.data());
    INFO("token " << b << " of " << n);
    CHECK(std::equal(alone.begin(), alone.end(), together.begin() + size_t(b) * out));
  }
}

}  // namespace

TEST_CASE("linear (our GEMV, BLAS sgemm) equals the reference, vector and portable", "[kernels]") {
  const bool portable = GENERATE(false, true);
  force_portable_kernels(portable);
  INFO((portable ? "portable" : "vector") << " kernels");
  std::mt19937 rng(1);
  // Widths off the vector and tile sizes with one or two tokens (our GEMV, not BLAS): an audit found a
  // dropped tail element went unseen.
  for (auto [n, in, out] :
       {std::tuple{1, 64, 96}, {7, 576, 192}, {33, 100, 3}, {128, 64, 64}, {1, 100, 5}, {2, 33, 7}, {1, 65, 17}}) {
    auto x = randn(size_t(n) * in, rng), w = randn(size_t(out) * in, rng, 0.1f), bias = randn(out, rng);
    std::vector<float> ref(size_t(n) * out), fast(ref.size());
    linear_ref(x.data(), w.data(), bias.data(), n, in, out, ref.data());
    linear(x.data(), w.data(), bias.data(), n, in, out, fast.data());
    CHECK(max_abs_diff(ref, fast) < 1e-4f);
    linear_tokens(x.data(), w.data(), bias.data(), n, in, out, fast.data());
    CHECK(max_abs_diff(ref, fast) < 1e-4f);
    check_tokens_apart(x, n, in, out, [&](const float* xs, int m, float* y) {
      linear_tokens(xs, w.data(), bias.data(), m, in, out, y);
    });
  }
  force_portable_kernels(false);
}

TEST_CASE("linear over bf16 weights equals the reference, vector and portable GEMV", "[kernels]") {
  const bool portable = GENERATE(false, true);
  force_portable_kernels(portable);
  INFO((portable ? "portable" : "vector") << " kernels");
  std::mt19937 rng(2);
  // Widths off the 8-lane vectors and row counts off the 4-row blocks; one token (GEMV) and several.
  for (auto [n, in, out] : {std::tuple{1, 64, 96},
                            {1, 13, 5},
                            {1, 577, 130},
                            {1, 2048, 7},
                            {2, 64, 9},
                            {7, 576, 192},
                            {33, 100, 3},
                            {40, 300, 513}}) {
    INFO("n " << n << " in " << in << " out " << out);
    auto x = randn(size_t(n) * in, rng), bias = randn(out, rng);
    const auto wf = randn(size_t(out) * in, rng, 0.1f);
    std::vector<uint16_t> w(wf.size());
    for (size_t i = 0; i < w.size(); ++i) w[i] = float_to_bf16(wf[i]);
    std::vector<float> ref(size_t(n) * out), fast(ref.size(), std::numeric_limits<float>::quiet_NaN());
    linear_bf16_ref(x.data(), w.data(), bias.data(), n, in, out, ref.data());
    linear_bf16(x.data(), w.data(), bias.data(), n, in, out, fast.data());
    CHECK(max_abs_diff(ref, fast) < 1e-4f);
    check_tokens_apart(x, n, in, out, [&](const float* xs, int m, float* y) {
      linear_bf16_tokens(xs, w.data(), bias.data(), m, in, out, y);
    });
  }
  force_portable_kernels(false);
}

TEST_CASE("activations quantized per block as ggml's q8 reference does", "[kernels]") {
  const bool portable = GENERATE(false, true);
  force_portable_kernels(portable);
  INFO((portable ? "portable" : "vector") << " kernels");
  std::mt19937 rng(4);
  auto x = randn(96, rng, 3.0f);
  std::fill(x.begin() + 32, x.begin() + 64, 0.0f);  // an all-zero block: d = 0, q = 0
  Q8Row q;
  quantize_row_q8(x.data(), 96, q);
  REQUIRE(q.d.size() == 3);
  CHECK(q.d[1] == 0.0f);
  for (int i = 0; i < 3; ++i) {
    int sum = 0, qmax = 0;
    for (int j = 0; j < 32; ++j) {
      const int v = q.q[size_t(i) * 32 + j];
      sum += v;
      qmax = std::max(qmax, std::abs(v));
      // d is stored at fp16: each value is within half a step (plus d's rounding) of x
      CHECK(std::abs(x[size_t(i) * 32 + j] - q.d[i] * float(v)) <= 0.5f * q.d[i] + 127 * q.d[i] * 1e-3f);
    }
    if (q.d[i] != 0.0f) CHECK(qmax == 127);
    CHECK(q.qsum[i] == sum);
    CHECK(q.s[i] == Approx(q.d[i] * float(sum)).epsilon(1e-3));
  }
  // With max |x| = 127, d = 1 and the values themselves are rounded: halves away from zero (roundf),
  // and the float just below a half down.
  const std::vector<float> halves = {127.0f, 2.5f,    -2.5f,       0.5f,         -0.5f,
                                     126.5f, -126.5f, 0.49999997f, -0.49999997f, 3.4f};
  std::vector<float> y(32, 0.0f);
  std::copy(halves.begin(), halves.end(), y.begin());
  quantize_row_q8(y.data(), 32, q);
  REQUIRE(q.d[0] == 1.0f);
  for (size_t j = 0; j < halves.size(); ++j) CHECK(q.q[j] == static_cast<int8_t>(std::round(halves[j])));
  force_portable_kernels(false);
}

TEST_CASE("activations quantized on vector lanes as by the portable loop, bit for bit", "[kernels]") {
  const bool avx2_only = GENERATE(false, true);
  INFO((avx2_only ? "held at AVX2" : cpu_kernel_path()));
  std::mt19937 rng(14);
  // 1e-7 and 1e-3: scales on fp16's subnormal grid; 3e6: scales beyond fp16's range (inf)
  for (float sd : {1e-7f, 1e-3f, 1.0f, 300.0f, 3e6f}) {
    INFO("sd " << sd);
    auto x = randn(32 * 48, rng, sd);
    std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
    // a block whose largest value is 127 (d = 1): its halves are exact ties
    x[96] = 127.0f;
    for (int j = 1; j < 32; ++j) x[size_t(96 + j)] = float(j) * 3.5f - 60.0f;
    Q8Row vec, port;
    cap_kernels_at_avx2(avx2_only);
    quantize_row_q8(x.data(), int(x.size()), vec);
    cap_kernels_at_avx2(false);
    force_portable_kernels(true);
    quantize_row_q8(x.data(), int(x.size()), port);
    force_portable_kernels(false);
    CHECK(vec.q == port.q);
    CHECK(std::memcmp(vec.d.data(), port.d.data(), vec.d.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(vec.s.data(), port.s.data(), vec.s.size() * sizeof(float)) == 0);
    CHECK(vec.qsum == port.qsum);
  }
}

namespace {

// The matrix [rows, cols] of blocks as the products read it, checked to give the blocks back.
std::vector<uint8_t> store(DType t, const std::vector<uint8_t>& blocks, int rows, int cols) {
  std::vector<uint8_t> stored(stored_bytes(t, rows, cols)), back(blocks.size());
  store_rows(t, blocks.data(), rows, cols, stored.data());
  load_rows(t, stored.data(), 0, rows, cols, back.data());
  REQUIRE(back == blocks);
  return stored;
}

// The products of n tokens on stored blocks with the kernels held at AVX2 and at the portable loop.
std::pair<std::vector<float>, std::vector<float>> avx2_and_portable(DType t, const std::vector<uint8_t>& stored,
                                                                    const std::vector<float>& x, int n, int in,
                                                                    int out) {
  std::vector<float> narrow(size_t(n) * out), portable(narrow.size());
  cap_kernels_at_avx2(true);
  linear_quant_tokens(t, stored.data(), nullptr, x.data(), n, in, out, narrow.data());
  cap_kernels_at_avx2(false);
  force_portable_kernels(true);
  linear_quant_tokens(t, stored.data(), nullptr, x.data(), n, in, out, portable.data());
  force_portable_kernels(false);
  return {narrow, portable};
}

// linear_quant on random blocks of type t (random bytes; fp16 scales from N(0, sd) at the byte offsets
// `scales_at` of each block): one token against `gemv_ref(x, w, y)` (activations quantized as the
// kernel does) and near the product with unquantized activations; more tokens against the
// dequantized product.
template <typename GemvRef>
void check_quant_products(DType t, const std::vector<size_t>& scales_at, float sd, std::mt19937& rng, int n, int in,
                          int out, GemvRef gemv_ref) {
  INFO(dtype_name(t) << " n " << n << " in " << in << " out " << out);
  const auto& info = dtype_info(t);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> w(size_t(out) * in / info.block_elems * info.block_bytes);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  std::normal_distribution<float> scale(0.0f, sd);
  for (size_t b = 0; b < w.size(); b += info.block_bytes)
    for (size_t at : scales_at) {
      const uint16_t h = float_to_half(scale(rng));
      std::memcpy(&w[b + at], &h, 2);
    }
  std::vector<float> wf(size_t(out) * in);
  dequantize_ref(t, w.data(), wf.data(), wf.size());
  auto x = randn(size_t(n) * in, rng), bias = randn(out, rng);
  std::vector<float> fast(size_t(n) * out, std::numeric_limits<float>::quiet_NaN()), ref(fast.size());
  const auto stored = store(t, w, out, in);
  linear_quant(t, stored.data(), bias.data(), x.data(), n, in, out, fast.data());
  if (n == 1) {
    gemv_ref(x.data(), w.data(), ref.data());
    for (int o = 0; o < out; ++o) ref[o] += bias[o];
    CHECK(max_abs_diff(ref, fast) < 1e-4f * std::max(1.0f, max_abs(ref)));
    // and near the product with unquantized activations (8-bit activations: ~1% of the scale)
    std::vector<float> exact(out);
    linear_ref(x.data(), wf.data(), bias.data(), 1, in, out, exact.data());
    CHECK(max_abs_diff(exact, fast) < 0.02f * std::max(1.0f, max_abs(exact)));
  } else {
    linear_ref(x.data(), wf.data(), bias.data(), n, in, out, ref.data());
    CHECK(max_abs_diff(ref, fast) < 1e-4f * std::max(1.0f, max_abs(ref)));
    check_tokens_apart(x, n, in, out, [&](const float* xs, int m, float* y) {
      linear_quant_tokens(t, stored.data(), bias.data(), xs, m, in, out, y);
    });
  }
}

}  // namespace

TEST_CASE("hand-computed Q5_0 and Q5_1 block products", "[kernels]") {
  // Element 0: low nibble of qs[0] with bit 0 of qh; element 16: high nibble of qs[0] with bit 16.
  Q8Row x;
  x.q.assign(32, 0);
  x.q[0] = 3;
  x.q[16] = -2;
  x.q[1] = 5;  // element 1: nibble 0, no fifth bit
  x.d = {0.5f};
  x.s = {0.5f * 6};  // d x sum(q)
  std::vector<uint8_t> q50(22, 0), q51(24, 0);
  const uint16_t one = float_to_half(1.0f), quarter = float_to_half(0.25f);
  std::memcpy(&q50[0], &one, 2);
  q50[2] = 0x01;      // qh bit 0
  q50[2 + 2] = 0x01;  // qh bit 16
  q50[6] = 0x27;      // qs[0]: low 7, high 2
  float y = 0;
  gemv_quant_ref(DType::Q5_0, q50.data(), x, 32, 1, &y);
  // (7|16)-16 = 7, (2|16)-16 = 2, 0-16 = -16: 0.5 (7*3 + 2*-2 - 16*5)
  CHECK(y == 0.5f * (21 - 4 - 80));
  std::memcpy(&q51[0], &one, 2);
  std::memcpy(&q51[2], &quarter, 2);
  q51[4] = 0x01;
  q51[4 + 2] = 0x01;
  q51[8] = 0x27;
  gemv_quant_ref(DType::Q5_1, q51.data(), x, 32, 1, &y);
  // 23, 18, 0, plus the min against d x sum(q): 0.5 (23*3 + 18*-2) + 0.25 * 3
  CHECK(y == 0.5f * (69 - 36) + 0.25f * 3.0f);
}

TEST_CASE("products on Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 blocks equal their references", "[kernels]") {
  const bool portable = GENERATE(false, true);
  force_portable_kernels(portable);
  INFO((portable ? "portable" : "vector") << " kernels");
  std::mt19937 rng(5);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0})
    for (auto [n, in, out] :
         {std::tuple{1, 32, 5}, {1, 576, 192}, {1, 1536, 37}, {3, 64, 9}, {17, 576, 300}, {1, 416, 7}, {2, 224, 5}})
      check_quant_products(t, t == DType::Q4_1 || t == DType::Q5_1 ? std::vector<size_t>{0, 2} : std::vector<size_t>{0},
                           0.01f, rng, n, in, out, [&](const float* x, const uint8_t* w, float* y) {
                             Q8Row q;
                             quantize_row_q8(x, in, q);
                             gemv_quant_ref(t, w, q, in, out, y);
                           });
  force_portable_kernels(false);
}

TEST_CASE("GGUF matrices stored in tiles: the blocks' bytes, any rows read back", "[kernels]") {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> byte(0, 255);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q6_K})
    for (int cols : {256, 416, 576, 1536, 2304})
      for (int rows : {7, 16, 37}) {
        INFO(dtype_name(t) << " cols " << cols << " rows " << rows);
        const auto& info = dtype_info(t);
        const size_t raw = size_t(cols) / info.block_elems * info.block_bytes;
        std::vector<uint8_t> w(rows * raw);
        for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
        const auto stored = store(t, w, rows, cols);
        // the file's bytes, the last tile padded to 16 rows
        const int padded = (rows + 15) / 16 * 16;
        CHECK(stored.size() == size_t(padded) * raw);
        for (int r0 : {3, rows - 2}) {  // inside the first tile, and across the last two
          std::vector<uint8_t> part(2 * raw);
          load_rows(t, stored.data(), r0, 2, cols, part.data());
          CHECK(std::equal(part.begin(), part.end(), w.begin() + r0 * raw));
        }
      }
}

TEST_CASE("products on stored GGUF rows read nothing past the matrix", "[kernels]") {
  // Each matrix here ends where a page that may not be read begins, so a read past its last tile (or a
  // prefetch turned into a load) would fault.
  const bool portable = GENERATE(false, true);
  force_portable_kernels(portable);
  std::mt19937 rng(10);
  const size_t page = 4096;
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q6_K})
    for (int cols : {32, 96, 224, 416, 576, 256, 768})
      for (int rows : {1, 3, 17}) {
        const auto& info = dtype_info(t);
        if (cols % info.block_elems) continue;
        INFO(dtype_name(t) << " cols " << cols << " rows " << rows);
        std::vector<uint8_t> w(size_t(rows) * cols / info.block_elems * info.block_bytes);
        for (auto& b : w) b = static_cast<uint8_t>(rng() & 0x3f);  // fp16 scales stay small and finite
        const size_t bytes = stored_bytes(t, rows, cols), span = (bytes + page - 1) / page * page + page;
        void* base = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        REQUIRE(base != MAP_FAILED);
        REQUIRE(mprotect(static_cast<uint8_t*>(base) + span - page, page, PROT_NONE) == 0);
        uint8_t* stored = static_cast<uint8_t*>(base) + span - page - bytes;
        store_rows(t, w.data(), rows, cols, stored);
        const auto x = randn(size_t(5) * cols, rng);
        std::vector<float> y(size_t(5) * rows), alone(rows);
        linear_quant_tokens(t, stored, nullptr, x.data(), 5, cols, rows, y.data());
        linear_quant(t, stored, nullptr, x.data() + size_t(4) * cols, 1, cols, rows, alone.data());
        CHECK(std::equal(alone.begin(), alone.end(), y.begin() + size_t(4) * rows));
        munmap(base, span);
      }
  force_portable_kernels(false);
}

TEST_CASE("products on GGUF blocks: AVX-512 VNNI, AVX2 and portable kernels give the same numbers", "[kernels]") {
  // Every byte value in the blocks (Q8_0's -128 included) against activations that reach +-127: the
  // pair sums AVX2 saturates at 16 bits come closest to the limit here. Row counts off the 16-row tiles.
  // The K-quants: every 6-bit scale and min and every signed 8-bit scale (random bytes), activations whose
  // blocks of 256 reach +-127 in every sub-block.
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> byte(0, 255);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q6_K})
    for (auto [n, in, out] : {std::tuple{1, 576, 37},
                              {3, 64, 9},
                              {4, 1536, 16},
                              {9, 576, 21},
                              {1, 416, 9},
                              {3, 224, 5},
                              {8, 96, 48},
                              {8, 512, 23},
                              {5, 768, 7}}) {
      const auto& info = dtype_info(t);
      if (in % info.block_elems) continue;
      INFO(dtype_name(t) << " n " << n << " in " << in << " out " << out);
      std::vector<uint8_t> w(size_t(out) * in / info.block_elems * info.block_bytes);
      for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
      const bool second = t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K;
      for (size_t b = 0; b < w.size(); b += info.block_bytes)
        for (size_t at : {size_t{0}, size_t{2}}) {
          if (at == 2 && !second) continue;
          const uint16_t h = float_to_half(0.01f * float(byte(rng) - 128) / 128.0f);
          std::memcpy(&w[b + (t == DType::Q6_K ? 208 : at)], &h, 2);
        }
      auto x = randn(size_t(n) * in, rng);
      for (size_t i = 0; i < x.size(); i += 16) x[i] = (i / 16) % 2 ? 4.0f : -4.0f;  // each sub-block's extreme
      std::vector<float> wide(size_t(n) * out);
      const auto stored = store(t, w, out, in);
      linear_quant_tokens(t, stored.data(), nullptr, x.data(), n, in, out, wide.data());
      const auto [narrow, portable] = avx2_and_portable(t, stored, x, n, in, out);
      CHECK(wide == narrow);
      CHECK(portable == narrow);
    }
}

TEST_CASE("products on GGUF blocks at the extremes: the AVX2 kernel's 16-bit pair sums do not saturate", "[kernels]") {
  // Every value at its largest (nibbles 15, fifth bits set) against activations all +-127: a 16-bit lane
  // of the pair sums the AVX2 kernel adds before widening comes closest to 32,767 here (30,480 for Q4).
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1})
    for (float sign : {1.0f, -1.0f}) {
      INFO(dtype_name(t) << " sign " << sign);
      const auto& info = dtype_info(t);
      const int n = 3, in = 256, out = 20;
      std::vector<uint8_t> w(size_t(out) * in / info.block_elems * info.block_bytes, 0xFF);
      const uint16_t d = float_to_half(0.01f), m = float_to_half(-0.05f);
      for (size_t b = 0; b < w.size(); b += info.block_bytes) {
        std::memcpy(&w[b], &d, 2);
        if (t == DType::Q4_1 || t == DType::Q5_1) std::memcpy(&w[b + 2], &m, 2);
      }
      const std::vector<float> x(size_t(n) * in, sign);
      const auto [narrow, portable] = avx2_and_portable(t, store(t, w, out, in), x, n, in, out);
      CHECK(narrow == portable);
      // and the value itself: every weight d x (15 | 31) - offset (+ m), every activation exactly sign
      const float value = t == DType::Q4_0   ? 0.01f * 7
                          : t == DType::Q4_1 ? 0.01f * 15 - 0.05f
                          : t == DType::Q5_0 ? 0.01f * 15
                                             : 0.01f * 31 - 0.05f;
      const std::vector<float> ref(narrow.size(), sign * value * in);
      CHECK(max_abs_diff(ref, narrow) < 1e-3f * std::abs(value) * in);
    }
}

TEST_CASE("products of the same tokens taken together equal each taken alone, bit for bit", "[kernels]") {
  // A layer's q, k and v (or gate and up) in one call: types mixed as in Q4_K_M files (a K-quant among
  // 32-value types), row counts off the 16-row tiles, a bias on some.
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  const int in = 512;
  struct Matrix {
    DType t;
    int out;
    std::vector<uint8_t> stored;
    std::vector<float> bias;
  };
  std::vector<Matrix> ms;
  for (auto [t, out, biased] : {std::tuple{DType::Q4_1, 37, true},
                                {DType::Q8_0, 16, false},
                                {DType::Q6_K, 9, true},
                                {DType::Q5_0, 21, false},
                                {DType::Q4_K, 5, false}}) {
    const auto& info = dtype_info(t);
    std::vector<uint8_t> w(size_t(out) * in / info.block_elems * info.block_bytes);
    for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
    std::vector<size_t> scales_at{0};
    if (t == DType::Q4_1 || t == DType::Q4_K) scales_at.push_back(2);
    if (t == DType::Q6_K) scales_at = {208};
    for (size_t b = 0; b < w.size(); b += info.block_bytes)
      for (size_t at : scales_at) {
        const uint16_t h = float_to_half(0.01f * float(byte(rng) - 128) / 128.0f);
        std::memcpy(&w[b + at], &h, 2);
      }
    ms.push_back({t, out, store(t, w, out, in), biased ? randn(size_t(out), rng) : std::vector<float>{}});
  }
  for (bool portable : {false, true})
    for (int n : {1, 3, 9}) {
      INFO((portable ? "portable" : "vector") << " kernels, n " << n);
      force_portable_kernels(portable);
      const auto x = randn(size_t(n) * in, rng);
      std::vector<std::vector<float>> together, alone;
      std::vector<QuantProduct> ps;
      for (const Matrix& m : ms) {
        together.emplace_back(size_t(n) * m.out, std::numeric_limits<float>::quiet_NaN());
        alone.emplace_back(size_t(n) * m.out);
      }
      for (size_t i = 0; i < ms.size(); ++i)
        ps.push_back({ms[i].t, ms[i].stored.data(), ms[i].bias.empty() ? nullptr : ms[i].bias.data(), ms[i].out,
                      together[i].data()});
      linear_quant_tokens_shared(ps, x.data(), n, in);
      for (size_t i = 0; i < ms.size(); ++i) {
        linear_quant_tokens(ms[i].t, ms[i].stored.data(), ps[i].bias, x.data(), n, in, ms[i].out, alone[i].data());
        CHECK(together[i] == alone[i]);
      }
      force_portable_kernels(false);
    }
}

TEST_CASE("activations quantized per block of 256 as ggml's q8_K reference does", "[kernels]") {
  std::mt19937 rng(6);
  auto x = randn(768, rng, 2.0f);
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero block
  x[700] = 9.0f;                                      // block 2's largest magnitude is positive
  Q8KRow q;
  quantize_row_q8_k(x.data(), 768, q);
  REQUIRE(q.d.size() == 3);
  CHECK(q.d[1] == 0.0f);
  CHECK(q.q[700] == -127);  // the value of largest magnitude maps to -127 (d < 0)
  CHECK(q.d[2] == Approx(9.0f / -127.0f));
  for (int i : {0, 2})
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) {
        const size_t e = size_t(i) * 256 + 16 * j + l;
        sum += q.q[e];
        CHECK(std::abs(x[e] - q.d[i] * float(q.q[e])) <= 0.5f * std::abs(q.d[i]) * 1.0001f);
      }
      CHECK(q.bsums[size_t(i) * 16 + j] == sum);
    }
}

TEST_CASE("products on Q4_K and Q6_K blocks equal their references", "[kernels]") {
  // AVX-512 VNNI where the CPU has it, AVX2, portable
  const std::string level = GENERATE("native", "avx2", "portable");
  cap_kernels_at_avx2(level == "avx2");
  force_portable_kernels(level == "portable");
  INFO(level << " kernels");
  std::mt19937 rng(7);
  for (DType t : {DType::Q4_K, DType::Q6_K})
    for (auto [n, in, out] : {std::tuple{1, 256, 5}, {1, 1536, 37}, {1, 768, 200}, {3, 512, 9}, {9, 768, 130}})
      check_quant_products(t, t == DType::Q4_K ? std::vector<size_t>{0, 2} : std::vector<size_t>{208}, 0.002f, rng, n,
                           in, out, [&](const float* x, const uint8_t* w, float* y) {
                             Q8KRow q;
                             quantize_row_q8_k(x, in, q);
                             gemv_kquant_ref(t, w, q, in, out, y);
                           });
  force_portable_kernels(false);
}

TEST_CASE("Q4_K and Q6_K blocks written by the quantizer read back within their steps", "[kernels]") {
  std::mt19937 rng(8);
  auto x = randn(4 * 256, rng, 0.05f);
  std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero block
  x[600] = 1.0f;                                      // an outlier in the third
  for (auto [t, rel_rms, rel_max] : {std::tuple{DType::Q4_K, 0.1f, 0.12f}, {DType::Q6_K, 0.03f, 0.035f}}) {
    INFO(dtype_name(t));
    std::vector<uint8_t> q(4 * dtype_info(t).block_bytes);
    quantize_kquant(t, x.data(), q.data(), x.size());
    std::vector<float> y(x.size());
    dequantize_ref(t, q.data(), y.data(), y.size());
    for (int b = 0; b < 4; ++b) {
      double err2 = 0, x2 = 0;
      float amax = 0, emax = 0;
      for (int j = 0; j < 256; ++j) {
        const size_t i = size_t(b) * 256 + j;
        err2 += double(x[i] - y[i]) * (x[i] - y[i]);
        x2 += double(x[i]) * x[i];
        amax = std::max(amax, std::abs(x[i]));
        emax = std::max(emax, std::abs(x[i] - y[i]));
      }
      if (b == 1) {
        CHECK(emax == 0.0f);
        continue;
      }
      CHECK(emax <= rel_max * amax);
      if (b != 2) CHECK(std::sqrt(err2 / x2) < rel_rms);  // the outlier's block has a coarse step
    }
  }
  require_error([] { quantize_kquant(DType::Q4_0, nullptr, nullptr, 256); }, {"not Q4_K or Q6_K"});
}

TEST_CASE("layernorm and gelu equal their references", "[kernels]") {
  std::mt19937 rng(12);
  // Rows far from zero mean: a one-pass variance (E[x^2] - E[x]^2) would lose them to cancellation.
  auto x = randn(5 * 4544, rng, 3.0f), w = randn(4544, rng), b = randn(4544, rng);
  for (size_t i = 0; i < 4544; ++i) x[i] += 300.0f;
  std::vector<float> ref(x.size()), fast(x.size());
  layernorm_ref(x.data(), w.data(), b.data(), 5, 4544, 1e-5f, ref.data());
  layernorm(x.data(), w.data(), b.data(), 5, 4544, 1e-5f, fast.data());
  CHECK(max_abs_diff(ref, fast) < 1e-5f);
  // Hand values: a row [1, 2, 3, 4] has mean 2.5 and variance 1.25.
  const std::vector<float> row = {1, 2, 3, 4}, ones(4, 1.0f), zeros(4, 0.0f);
  std::vector<float> y(4);
  layernorm(row.data(), ones.data(), zeros.data(), 1, 4, 0.0f, y.data());
  CHECK_THAT(y[0], Catch::Matchers::WithinAbs(-1.5 / std::sqrt(1.25), 1e-6));
  CHECK_THAT(y[3], Catch::Matchers::WithinAbs(1.5 / std::sqrt(1.25), 1e-6));

  auto g = randn(100003, rng, 4.0f);
  std::vector<float> g_ref(g.size()), g_fast(g.size());
  gelu_ref(g.data(), g.size(), g_ref.data());
  gelu(g.data(), g.size(), g_fast.data());
  CHECK(max_abs_diff(g_ref, g_fast) < 2e-6f);
  // torch.nn.GELU()(1.0) and (-2.0), the exact erf form.
  const std::vector<float> at = {1.0f, -2.0f};
  std::vector<float> got(2);
  gelu(at.data(), 2, got.data());
  CHECK_THAT(got[0], Catch::Matchers::WithinAbs(0.8413447460685429, 1e-7));
  CHECK_THAT(got[1], Catch::Matchers::WithinAbs(-0.04550026389635842, 1e-7));
}

TEST_CASE("exp_table is std::exp(float) bit for bit where glibc computes it with FMA", "[kernels]") {
#if defined(__GLIBC__)
  if (!cpu_has_avx2()) {
    WARN("skipped: glibc's expf without FMA rounds its steps differently");
    return;
  }
  // Every 509th float (all exponents, both signs, infinities and NaNs among them), then a dense run.
  size_t differ = 0, tried = 0;
  auto check = [&](uint32_t bits) {
    const float x = std::bit_cast<float>(bits);
    ++tried;
    if (std::bit_cast<uint32_t>(exp_table(x)) != std::bit_cast<uint32_t>(std::exp(x))) {
      if (differ++ < 5) UNSCOPED_INFO("x = " << x << " (bits " << bits << ")");
    }
  };
  for (uint64_t b = 0; b <= 0xffffffffu; b += 509) check(static_cast<uint32_t>(b));
  for (uint32_t b = std::bit_cast<uint32_t>(-3.0f); b < std::bit_cast<uint32_t>(-3.0f) + 200000; ++b) check(b);
  INFO(tried << " values");
  CHECK(differ == 0);
#else
  WARN("skipped: std::exp is not glibc's here");
#endif
}

TEST_CASE("SwiGLU's vector forms give the loop's numbers, exp by exp_table", "[kernels]") {
  std::mt19937 rng(12);
  auto g = randn(1037, rng, 6.0f), u = randn(1037, rng);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float edges[] = {0.0f,    -0.0f,   87.99f, -87.99f, 88.0f, -88.0f, 89.0f,  -89.0f,
                         100.0f,  -100.0f, 104.0f, -104.0f, inf,   -inf,   nan,    1e-40f,
                         -1e-40f, 3e38f,   -3e38f, 1e-8f,   20.5f, -20.5f, 0.125f, -16.0f};
  for (size_t i = 0; i < std::size(edges); ++i) g[i * 37] = edges[i];
  std::vector<float> want(g.size());
  for (size_t i = 0; i < g.size(); ++i) want[i] = g[i] / (1.0f + exp_table(-g[i])) * u[i];
  for (const char* level : {"native", "avx2", "portable"}) {
    INFO("kernels " << level);
    cap_kernels_at_avx2(level == std::string("avx2"));
    if (level == std::string("portable")) force_portable_kernels(true);
    for (size_t n : {size_t(1037), size_t(16), size_t(7)}) {
      INFO("n " << n);
      std::vector<float> got(n);
      swiglu(g.data(), u.data(), n, got.data());
      CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
    }
  }
  force_portable_kernels(false);
}

TEST_CASE("rmsnorm's rows side by side on vector lanes give the one-row loop's bits, in place too", "[kernels]") {
  std::mt19937 rng(13);
  for (auto [n, dim] : {std::pair{1, 576}, {3, 64}, {8, 576}, {9, 7}, {17, 128}, {40, 1536}}) {
    INFO("n " << n << " dim " << dim);
    auto x = randn(size_t(n) * dim, rng, 5.0f), w = randn(size_t(dim), rng);
    std::vector<float> want(x.size()), got(x.size());
    force_portable_kernels(true);
    rmsnorm(x.data(), w.data(), n, dim, 1e-6f, want.data());
    force_portable_kernels(false);
    rmsnorm(x.data(), w.data(), n, dim, 1e-6f, got.data());
    CHECK(got == want);
    rmsnorm(x.data(), w.data(), n, dim, 1e-6f, x.data());
    CHECK(x == want);
  }
}

TEST_CASE("rmsnorm, swiglu and rope equal their references", "[kernels]") {
  std::mt19937 rng(2);
  auto x = randn(5 * 576, rng, 3.0f), w = randn(576, rng);
  std::vector<float> ref(x.size()), fast(x.size());
  rmsnorm_ref(x.data(), w.data(), 5, 576, 1e-5f, ref.data());
  rmsnorm(x.data(), w.data(), 5, 576, 1e-5f, fast.data());
  CHECK(max_abs_diff(ref, fast) < 1e-5f);

  auto g = randn(1000, rng, 4.0f), u = randn(1000, rng);
  std::vector<float> s_ref(1000), s_fast(1000);
  swiglu_ref(g.data(), u.data(), 1000, s_ref.data());
  swiglu(g.data(), u.data(), 1000, s_fast.data());
  CHECK(max_abs_diff(s_ref, s_fast) < 1e-5f);

  for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::NeoX}) {
    const int n = 6, heads = 3, d = 64;
    std::vector<float> inv(d / 2);
    for (int i = 0; i < d / 2; ++i)
      inv[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(d));
    std::vector<int32_t> pos = {0, 1, 2, 100, 5000, 8191};
    auto a = randn(size_t(n) * heads * d, rng), b = a;
    rope_ref(a.data(), n, heads, d, pos.data(), inv, style);
    RopeTable table(inv, style);
    table.ensure(8191);
    table.apply(b.data(), n, heads, d, pos.data());
    CHECK(a == b);  // same angles, same rounding: identical bits
    // Rotation preserves each pair's norm, and position 0 is the identity.
    auto c = randn(size_t(heads) * d, rng), c0 = c;
    int32_t zero = 0;
    table.apply(c.data(), 1, heads, d, &zero);
    CHECK(c == c0);
  }
}

TEST_CASE("the two RoPE layouts agree up to the dimension permutation", "[kernels]") {
  // Interleaved pairs (2i, 2i+1) on a vector equal NeoX pairs (i, i + d/2) on the permuted vector:
  // this is why GGUF llama files (permuted Q/K rows) and Hugging Face weights give the same model.
  std::mt19937 rng(3);
  const int d = 16;
  std::vector<float> inv(d / 2);
  for (int i = 0; i < d / 2; ++i) inv[i] = 1.0f / std::pow(500.0f, static_cast<float>(2 * i) / static_cast<float>(d));
  auto x = randn(d, rng);
  std::vector<float> perm(d);
  for (int i = 0; i < d / 2; ++i) {
    perm[i] = x[2 * i];
    perm[i + d / 2] = x[2 * i + 1];
  }
  int32_t p = 37;
  rope_ref(x.data(), 1, 1, d, &p, inv, RopeStyle::Interleaved);
  rope_ref(perm.data(), 1, 1, d, &p, inv, RopeStyle::NeoX);
  for (int i = 0; i < d / 2; ++i) {
    CHECK(perm[i] == x[2 * i]);
    CHECK(perm[i + d / 2] == x[2 * i + 1]);
  }
}

TEST_CASE("the backend prefill attention equals the reference, with and without column sums", "[kernels]") {
  std::mt19937 rng(4);
  auto backend = make_cpu_backend();
  for (auto [n, hq, hkv, d] : {std::tuple{1, 2, 1, 8}, {5, 4, 2, 16}, {300, 6, 2, 32}, {600, 3, 3, 64}}) {
    auto q = randn(size_t(n) * hq * d, rng), k = randn(size_t(n) * hkv * d, rng), v = randn(size_t(n) * hkv * d, rng);
    std::vector<int32_t> pos(n);
    for (int i = 0; i < n; ++i) pos[i] = i;
    std::vector<float> ref(size_t(n) * hq * d);
    attention_ref(q.data(), k.data(), v.data(), n, n, hq, hkv, d, pos.data(), pos.data(), ref.data());
    Buffer qb = to_buffer(*backend, q), kb = to_buffer(*backend, k), vb = to_buffer(*backend, v),
           ob(*backend, ref.size());
    std::vector<float> colsum;
    backend->attention_prefill(qb, kb, vb, n, hq, hkv, d, ob, &colsum);
    INFO("n=" << n << " hq=" << hq << " hkv=" << hkv << " d=" << d);
    CHECK(max_abs_diff(ref, from_buffer(*backend, ob)) < 1e-4f);
    // Every query's probabilities sum to one, so each head's column sums add up to n.
    for (int h = 0; h < hq; ++h) {
      double total = 0;
      for (int j = 0; j < n; ++j) total += colsum[size_t(h) * n + j];
      CHECK(total == Approx(n).epsilon(1e-4));
    }
    // The last key is seen only by the last query.
    CHECK(colsum[size_t(n) - 1] > 0);
    // Asking for column sums leaves the output bit for bit as it is without them.
    Buffer ob2(*backend, ref.size());
    backend->attention_prefill(qb, kb, vb, n, hq, hkv, d, ob2, nullptr);
    CHECK(from_buffer(*backend, ob2) == from_buffer(*backend, ob));
  }
}

TEST_CASE("fused prefill attention equals the blockwise kernel, with column sums", "[kernels]") {
  std::mt19937 rng(11);
  auto max_abs = [](const std::vector<float>& x) {
    float m = 0;
    for (float v : x) m = std::max(m, std::abs(v));
    return m;
  };
  // GQA groups 1 to 7 (the fused kernel stacks a group's query rows), head sizes 8 to 128, lengths
  // that are and are not multiples of the tiles; `sharp` scales the queries so that the softmax is
  // dominated by a few keys and the running max moves between key tiles.
  for (auto [n, hq, hkv, d, sharp] : {std::tuple{1, 2, 1, 8, 1.0f},
                                      {5, 4, 2, 16, 1.0f},
                                      {255, 9, 3, 64, 1.0f},
                                      {257, 9, 3, 64, 4.0f},
                                      {700, 6, 2, 32, 1.0f},
                                      {513, 8, 1, 64, 3.0f},
                                      {300, 28, 4, 128, 1.0f},
                                      {450, 4, 4, 64, 6.0f},
                                      {1030, 3, 3, 64, 2.0f}}) {
    INFO("n=" << n << " hq=" << hq << " hkv=" << hkv << " d=" << d << " sharp=" << sharp);
    auto q = randn(size_t(n) * hq * d, rng, sharp), k = randn(size_t(n) * hkv * d, rng),
         v = randn(size_t(n) * hkv * d, rng);
    std::vector<float> ref(size_t(n) * hq * d), fused(ref.size()), ref_cs(size_t(hq) * n), fused_cs(ref_cs.size());
    attention_prefill_blockwise(q.data(), k.data(), v.data(), n, hq, hkv, d, ref.data(), ref_cs.data());
    // AVX-512 and AVX2 register tiles where the CPU and head size allow them, and the portable BLAS
    // products; the two tile widths give the same outputs and column sums bit for bit, and so does a
    // second run (the threads' shares of the column sums are added in a fixed order).
    std::vector<float> wide, wide_cs;
    for (const char* level : {"native", "avx2", "portable"}) {
      INFO("kernels " << level);
      // each call sets the level outright, so the last one holds
      cap_kernels_at_avx2(level == std::string("avx2"));
      if (level == std::string("portable")) force_portable_kernels(true);
      attention_prefill_fused(q.data(), k.data(), v.data(), n, hq, hkv, d, fused.data(), fused_cs.data());
      CHECK(max_abs_diff(ref, fused) <= 1e-5f * max_abs(ref));
      CHECK(max_abs_diff(ref_cs, fused_cs) <= 1e-5f * max_abs(ref_cs));
      // Without column sums the output is the same.
      std::vector<float> plain(ref.size());
      attention_prefill_fused(q.data(), k.data(), v.data(), n, hq, hkv, d, plain.data(), nullptr);
      CHECK(plain == fused);
      std::vector<float> again(ref.size()), again_cs(ref_cs.size());
      attention_prefill_fused(q.data(), k.data(), v.data(), n, hq, hkv, d, again.data(), again_cs.data());
      CHECK(again == fused);
      CHECK(again_cs == fused_cs);
      if (level == std::string("native")) {
        wide = fused;
        wide_cs = fused_cs;
      } else if (level == std::string("avx2") && cpu_has_avx2()) {
        CHECK(fused == wide);
        CHECK(fused_cs == wide_cs);
      }
    }
    force_portable_kernels(false);
    attention_prefill_fused(q.data(), k.data(), v.data(), n, hq, hkv, d, fused.data(), fused_cs.data());
    if (n <= 300) {  // and both agree with the double-precision reference
      std::vector<int32_t> pos(n);
      for (int i = 0; i < n; ++i) pos[i] = i;
      std::vector<float> exact(ref.size());
      attention_ref(q.data(), k.data(), v.data(), n, n, hq, hkv, d, pos.data(), pos.data(), exact.data());
      CHECK(max_abs_diff(exact, fused) <= 1e-5f * max_abs(exact));
    }
  }
}

TEST_CASE("a continued prefill's attention rows equal the whole prompt's and its column sums split by queries",
          "[kernels]") {
  std::mt19937 rng(12);
  // Splits before, at and after tile boundaries (96 rows, 256 and 512 keys), one new query among many.
  for (auto [n, past, hq, hkv, d] : {std::tuple{300, 1, 9, 3, 64},
                                     {300, 299, 9, 3, 64},
                                     {600, 256, 6, 2, 32},
                                     {700, 97, 4, 4, 64},
                                     {520, 300, 8, 1, 16},
                                     {130, 60, 4, 2, 8}}) {
    INFO("n=" << n << " past=" << past << " hq=" << hq << " hkv=" << hkv << " d=" << d);
    const int rest = n - past, ldq = hq * d;
    auto q = randn(size_t(n) * ldq, rng, 2.0f), k = randn(size_t(n) * hkv * d, rng),
         v = randn(size_t(n) * hkv * d, rng);
    for (bool portable : {false, true}) {
      INFO("portable " << portable);
      force_portable_kernels(portable);
      std::vector<float> whole(size_t(n) * ldq), cs_whole(size_t(hq) * n);
      attention_prefill_fused(q.data(), k.data(), v.data(), n, hq, hkv, d, whole.data(), cs_whole.data());
      std::vector<float> head(size_t(past) * ldq), cs_head(size_t(hq) * past);
      attention_prefill_fused(q.data(), k.data(), v.data(), past, hq, hkv, d, head.data(), cs_head.data());
      std::vector<float> tail(size_t(rest) * ldq), cs_tail(size_t(hq) * n);
      attention_prefill_fused(q.data() + size_t(past) * ldq, k.data(), v.data(), rest, hq, hkv, d, tail.data(),
                              cs_tail.data(), past);
      // Every row is computed as in the whole prompt's pass: on the register tiles equal, not just close;
      // BLAS may sum a product's rows differently for a different number of them.
      const std::vector<float> whole_tail(whole.begin() + std::ptrdiff_t(past) * ldq, whole.end());
      if (!portable && cpu_has_avx2() && d % 16 == 0) {
        CHECK(std::equal(head.begin(), head.end(), whole.begin()));
        CHECK(tail == whole_tail);
      }
      CHECK(max_abs_diff(tail, whole_tail) <= 1e-5f * max_abs(whole_tail));
      // The sums of the two passes make the whole one's (up to the order of the additions).
      float worst = 0, top = 0;
      for (int h = 0; h < hq; ++h)
        for (int j = 0; j < n; ++j) {
          const float joined = cs_tail[size_t(h) * n + j] + (j < past ? cs_head[size_t(h) * past + j] : 0.0f);
          worst = std::max(worst, std::abs(joined - cs_whole[size_t(h) * n + j]));
          top = std::max(top, std::abs(cs_whole[size_t(h) * n + j]));
        }
      CHECK(worst <= 1e-5f * top);
      // The blockwise reference continues the same way.
      std::vector<float> ref(tail.size()), cs_ref(cs_tail.size());
      attention_prefill_blockwise(q.data() + size_t(past) * ldq, k.data(), v.data(), rest, hq, hkv, d, ref.data(),
                                  cs_ref.data(), past);
      CHECK(max_abs_diff(ref, tail) <= 1e-5f);
      CHECK(max_abs_diff(cs_ref, cs_tail) <= 1e-5f * top);
    }
    force_portable_kernels(false);
  }
}

TEST_CASE("decode attention over a multi-segment cache equals the reference", "[kernels]") {
  std::mt19937 rng(5);
  const int hq = 6, hkv = 2, d = 32;
  LayerCache cache(hq, hkv, d);
  // Two dense segments per head (a second one starts after an explicit break).
  for (int t = 0; t < 40; ++t) {
    auto k = randn(size_t(hkv) * d, rng), v = randn(size_t(hkv) * d, rng);
    cache.append(k.data(), v.data(), t);
  }
  for (int h = 0; h < hkv; ++h) cache.segments(h).push_back(std::make_unique<DenseSegment>(d));
  for (int t = 40; t < 57; ++t) {
    auto k = randn(size_t(hkv) * d, rng), v = randn(size_t(hkv) * d, rng);
    for (int h = 0; h < hkv; ++h)
      static_cast<DenseSegment&>(*cache.segments(h).back()).append(k.data() + h * d, v.data() + h * d, t);
  }
  CHECK(cache.tokens(0) == 57);
  CHECK(cache.bytes() == size_t(57) * hkv * d * 2 * sizeof(float));
  auto q = randn(size_t(hq) * d, rng, 2.0f);
  std::vector<float> fast(size_t(hq) * d), ref(fast.size());
  attend(cache, q.data(), fast.data());
  attend_ref(cache, q.data(), ref.data());
  CHECK(max_abs_diff(ref, fast) < 1e-5f);
}

TEST_CASE("decode attention gives every query head the same numbers however its heads are spread over threads",
          "[kernels]") {
  std::mt19937 rng(6);
  // 3 KV heads of 3 query heads (the default model's shape: cut into runs of tokens and channels when
  // the heads do not divide among the threads) and 2 of 4; two segments a head, long enough to be cut.
  for (auto dtype : {KvDtype::F16, KvDtype::BF16, KvDtype::F32})
    for (auto [hq, hkv] : {std::pair{9, 3}, {8, 2}}) {
      const int d = 64;
      LayerCache cache(hq, hkv, d, dtype);
      for (int t = 0; t < 301; ++t) {
        auto k = randn(size_t(hkv) * d, rng), v = randn(size_t(hkv) * d, rng);
        cache.append(k.data(), v.data(), t);
      }
      for (int h = 0; h < hkv; ++h) cache.segments(h).push_back(std::make_unique<DenseSegment>(d, dtype));
      for (int t = 301; t < 390; ++t) {
        auto k = randn(size_t(hkv) * d, rng), v = randn(size_t(hkv) * d, rng);
        for (int h = 0; h < hkv; ++h)
          static_cast<DenseSegment&>(*cache.segments(h).back()).append(k.data() + h * d, v.data() + h * d, t);
      }
      const auto q = randn(size_t(hq) * d, rng, 2.0f);
      INFO(kv_dtype_name(dtype) << ": " << hq << " query heads over " << hkv);
      const auto ref = test::attend_across_threads(cache, q, {2, 3, 4, 5, 16});
      std::vector<float> out(q.size());
      attend_ref(cache, q.data(), out.data());
      CHECK(max_abs_diff(ref, out) < 1e-5f);
    }
}

TEST_CASE("fast exp is within 2 ulp of std::exp and sums what it wrote", "[kernels]") {
  std::vector<float> x;
  for (float v = -100.0f; v < 88.5f; v += 0.0137f) x.push_back(v);
  x.insert(x.end(), {0.0f, -0.0f, 1e-8f, -1e-8f, 88.5f, -87.0f, -86.9f, -std::numeric_limits<float>::infinity()});
  auto ref = x;
  exp_shifted_ref(ref.data(), static_cast<int>(ref.size()), 0.5f);
  for (bool portable : {false, true}) {
    INFO("portable " << portable);
    force_portable_kernels(portable);
    // Lengths around the vector widths reach the tails; the whole range the values.
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(17), size_t(31), x.size()}) {
      auto fast = x;
      fast.push_back(123.0f);  // past n: must stay untouched
      const float sum = exp_shifted(fast.data(), static_cast<int>(n), 0.5f);
      CHECK(fast[n] == (n < x.size() ? x[n] : 123.0f));
      int worst = 0;
      double total = 0;
      for (size_t i = 0; i < n; ++i) {
        total += fast[i];
        if (x[i] - 0.5f < -87.0f) {
          CHECK(fast[i] == 0.0f);
          continue;
        }
        const int ulps = std::abs(std::bit_cast<int32_t>(ref[i]) - std::bit_cast<int32_t>(fast[i]));
        worst = std::max(worst, ulps);
      }
      INFO("n " << n << ", worst ulp distance " << worst);
      CHECK(worst <= 2);
      if (total < std::numeric_limits<float>::max())
        CHECK(sum == Approx(total).epsilon(1e-5));
      else  // the whole range reaches e^88 many times over
        CHECK(std::isinf(sum));
    }
    float nan = std::numeric_limits<float>::quiet_NaN();
    exp_shifted(&nan, 1, 0.0f);
    CHECK(std::isnan(nan));
  }
  force_portable_kernels(false);
}

TEST_CASE("fast exp: AVX-512 equals AVX2 bit for bit, and a scale equals scaling first", "[kernels]") {
  std::vector<float> x;
  for (float v = -120.0f; v < 95.0f; v += 0.0731f) x.push_back(v);
  x.insert(x.end(), {0.0f, -0.0f, 88.5f, -87.0f, -std::numeric_limits<float>::infinity(),
                     std::numeric_limits<float>::quiet_NaN()});
  const float scale = 0.125f * 1.0001f, shift = 3.25f;
  for (size_t n :
       {size_t(0), size_t(5), size_t(8), size_t(15), size_t(16), size_t(23), size_t(24), size_t(41), x.size()}) {
    INFO("n " << n);
    auto scaled = x, wide = x, narrow = x, first = x;
    for (auto& v : first) v *= scale;
    const float s_first = exp_shifted(first.data(), static_cast<int>(n), shift);
    const float s_scaled = exp_shifted(scaled.data(), static_cast<int>(n), shift, scale);
    CHECK(std::bit_cast<uint32_t>(s_first) == std::bit_cast<uint32_t>(s_scaled));
    for (size_t i = 0; i < n; ++i) REQUIRE(std::bit_cast<uint32_t>(first[i]) == std::bit_cast<uint32_t>(scaled[i]));
    if (!cpu_has_avx512()) continue;  // the AVX2 form is the only vector one here
    const float s_wide = exp_shifted(wide.data(), static_cast<int>(n), shift, scale);
    cap_kernels_at_avx2(true);
    const float s_narrow = exp_shifted(narrow.data(), static_cast<int>(n), shift, scale);
    cap_kernels_at_avx2(false);
    CHECK(std::bit_cast<uint32_t>(s_wide) == std::bit_cast<uint32_t>(s_narrow));
    for (size_t i = 0; i < x.size(); ++i)
      REQUIRE(std::bit_cast<uint32_t>(wide[i]) == std::bit_cast<uint32_t>(narrow[i]));
  }
}

TEST_CASE("the kernel path a record names follows the forced level", "[kernels]") {
  force_portable_kernels(true);
  CHECK(cpu_kernel_path().rfind("portable, clones ", 0) == 0);
  cap_kernels_at_avx2(true);
  CHECK(cpu_kernel_path().rfind(cpu_has_avx2() ? "avx2, clones " : "portable, clones ", 0) == 0);
  cap_kernels_at_avx2(false);
  force_portable_kernels(false);
  CHECK(cpu_kernel_path().rfind(cpu_has_avx512() ? "avx512, clones "
                                : cpu_has_avx2() ? "avx2, clones "
                                                 : "portable, clones ",
                                0) == 0);
}

TEST_CASE("OpenBLAS's fallback kernels are replaced by those of the processor's instruction set", "[kernels]") {
  CHECK(std::string_view(blas_core_choice("Prescott", false, true, true)) == "SkylakeX");
  CHECK(std::string_view(blas_core_choice("Prescott", false, false, true)) == "Haswell");
  CHECK(blas_core_choice("Prescott", false, false, false) == nullptr);  // a processor that old: its kernels
  CHECK(blas_core_choice("Prescott", true, true, true) == nullptr);     // OPENBLAS_CORETYPE stands
  CHECK(blas_core_choice("Haswell", false, true, true) == nullptr);     // OpenBLAS's own judgement stands
  CHECK(blas_core_choice("Zen", false, true, true) == nullptr);
  // This process went through main's re-exec: unless the user named a core, it is not on the fallback
  // where the processor has AVX2.
  const char* told = std::getenv("OPENBLAS_CORETYPE");
  const char* ours = blas_core_choice("Prescott", false, cpu_has_avx512(), cpu_has_avx2());
  if (ours != nullptr && (told == nullptr || std::string_view(told) == ours))
    CHECK(std::string_view(openblas_get_corename()) != "Prescott");
}

TEST_CASE("products with sign bits equal the reference on both paths", "[kernels]") {
  std::mt19937 rng(17);
  for (const int n : {8, 24, 128, 256, 512}) {
    const size_t tokens = 37, stride = size_t(n / 8) + 3;  // rows further apart than their codes
    const auto x = randn(size_t(n), rng);
    std::vector<uint8_t> codes(tokens * stride);
    for (auto& c : codes) c = uint8_t(rng());
    std::vector<float> want(tokens), got(tokens);
    sign_dots_ref(codes.data(), tokens, stride, x.data(), n, want.data());
    double scale = 0;
    for (const float v : x) scale += std::abs(v);
    // One hand-checked row: all bits set is sum x, none is -sum x.
    std::fill(codes.begin(), codes.begin() + std::ptrdiff_t(stride), uint8_t(0xff));
    std::fill(codes.begin() + std::ptrdiff_t(stride), codes.begin() + std::ptrdiff_t(2 * stride), uint8_t(0));
    sign_dots_ref(codes.data(), 2, stride, x.data(), n, want.data());
    double sum = 0;
    for (const float v : x) sum += v;
    CHECK(std::abs(want[0] - sum) <= 1e-6 * scale);
    CHECK(std::abs(want[1] + sum) <= 1e-6 * scale);
    for (const bool portable : {true, false}) {
      force_portable_kernels(portable);
      sign_dots(codes.data(), tokens, stride, x.data(), n, got.data());
      force_portable_kernels(false);
      INFO("n " << n << (portable ? " portable" : " dispatched"));
      for (size_t t = 0; t < tokens; ++t) CHECK(std::abs(got[t] - want[t]) <= 1e-5 * scale);
    }
  }
}

TEST_CASE("products with sign bits: a group of vectors at once equals each alone on the AVX2 path, at both levels",
          "[kernels]") {
  std::mt19937 rng(23);
  for (const int n : {8, 24, 128, 256, 512})
    for (const size_t tokens : {size_t(1), size_t(37)})
      for (const int g : {1, 3, 4, 7}) {
        INFO("n " << n << " tokens " << tokens << " vectors " << g);
        const size_t stride = size_t(n / 8) + 3, ldx = size_t(n) + 5;
        const auto x = randn(size_t(g) * ldx, rng);
        std::vector<uint8_t> codes(tokens * stride);
        for (auto& c : codes) c = uint8_t(rng());
        std::vector<float> group(size_t(g) * tokens), group_avx2(group.size()), alone(tokens);
        sign_dots_group(codes.data(), tokens, stride, x.data(), ldx, g, n, group.data(), tokens);
        cap_kernels_at_avx2(true);
        sign_dots_group(codes.data(), tokens, stride, x.data(), ldx, g, n, group_avx2.data(), tokens);
        for (int j = 0; j < g; ++j) {
          sign_dots(codes.data(), tokens, stride, x.data() + size_t(j) * ldx, n, alone.data());
          CHECK(std::memcmp(alone.data(), group.data() + size_t(j) * tokens, tokens * sizeof(float)) == 0);
          CHECK(std::memcmp(alone.data(), group_avx2.data() + size_t(j) * tokens, tokens * sizeof(float)) == 0);
        }
        cap_kernels_at_avx2(false);
      }
}

TEST_CASE("per-token codes: attention products equal the reference loop bit for bit", "[kernels]") {
  const bool avx2_only = GENERATE(false, true);
  INFO((avx2_only ? "held at AVX2" : cpu_kernel_path()));
  cap_kernels_at_avx2(avx2_only);
  std::mt19937 rng(91);
  for (int bits : {2, 4, 8})
    for (auto [d, group] : {std::pair{64, 64}, std::pair{64, 16}, std::pair{128, 32}, std::pair{48, 48},
                            std::pair{40, 8}, std::pair{13, 13}})
      for (size_t n : {size_t(1), size_t(37), size_t(300)}) {
        INFO("bits " << bits << " d " << d << " group " << group << " tokens " << n);
        const size_t rb = (size_t(d) * size_t(bits) + 7) / 8;
        std::vector<uint8_t> codes(n * rb);
        for (auto& b : codes) b = static_cast<uint8_t>(rng());
        std::vector<uint16_t> steps(n * size_t(d / group));
        for (auto& s : steps) s = float_to_half(std::uniform_real_distribution<float>(1e-3f, 2.0f)(rng));
        const TokenCodesView c{codes.data(), steps.data(), n, d, bits, group};
        for (int g : {1, 3, 4, 7}) {
          INFO("queries " << g);
          const auto q = randn(size_t(g) * d, rng);
          auto p = randn(size_t(g) * n, rng);
          for (size_t i = 0; i < p.size(); i += 4) p[i] = 0.0f;
          for (auto [t0, t1] : {std::pair{size_t(0), n}, std::pair{n / 3, n - n / 5}}) {
            std::vector<float> fast(size_t(g) * n, -1.0f), ref(fast);
            token_codes_dot(c, q.data(), g, t0, t1, fast.data(), n);
            token_codes_dot_ref(c, q.data(), g, t0, t1, ref.data(), n);
            REQUIRE(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)) == 0);
          }
          for (auto [c0, c1] : {std::pair{0, d}, std::pair{16, d - d % 16}}) {
            if (c1 <= c0) continue;
            std::vector<float> fast = randn(size_t(g) * d, rng), ref(fast);
            token_codes_axpy(c, p.data(), g, n, c0, c1, fast.data());
            token_codes_axpy_ref(c, p.data(), g, n, c0, c1, ref.data());
            REQUIRE(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)) == 0);
          }
        }
      }
  cap_kernels_at_avx2(false);
}
