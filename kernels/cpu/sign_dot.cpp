#include "kernels/cpu/sign_dot.hpp"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/avx2.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "kernels/cpu/query_runs.hpp"

namespace kvb {

void sign_dots_ref(const uint8_t* codes, size_t tokens, size_t stride, const float* x, int n, float* out) {
  for (size_t t = 0; t < tokens; ++t) {
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += (codes[t * stride + size_t(j / 8)] >> (j % 8)) & 1 ? x[j] : -double(x[j]);
    out[t] = float(sum);
  }
}

namespace {

void sign_dots_portable(const uint8_t* codes, size_t tokens, size_t stride, const float* x, int n, float* out) {
  // 2 sum(x over set bits) - sum(x): one add per set bit, no sign per element.
  float total = 0;
  for (int j = 0; j < n; ++j) total += x[j];
  for (size_t t = 0; t < tokens; ++t) {
    float set = 0;
    const uint8_t* c = codes + t * stride;
    for (int b = 0; b < n / 8; ++b)
      for (int j = 0; j < 8; ++j)
        if ((c[b] >> j) & 1) set += x[8 * b + j];
    out[t] = 2 * set - total;
  }
}

// A byte broadcast to eight lanes, each tested against its lane's bit: the sign bit where the bit is clear.
__attribute__((target("avx2,fma"))) inline __m256 clear_bits_sign(uint8_t byte) {
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 clear =
      _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(byte), bit), _mm256_setzero_si256()));
  return _mm256_and_ps(clear, _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u))));
}

// A clear bit flips the sign of x; two accumulators over alternate bytes, bytes taken in pairs so that
// both stay in registers (indexed by parity they lived on the stack). G vectors x [G, ldx] at once, each
// byte's signs formed once for all of them.
template <int G>
__attribute__((target("avx2,fma"))) void sign_dots_avx2(const uint8_t* codes, size_t tokens, size_t stride,
                                                        const float* x, size_t ldx, int n, float* out, size_t ldo) {
  const int bytes = n / 8;
  for (size_t t = 0; t < tokens; ++t) {
    const uint8_t* c = codes + t * stride;
    __m256 even[G], odd[G];
    for (int j = 0; j < G; ++j) even[j] = odd[j] = _mm256_setzero_ps();
    int b = 0;
    for (; b + 1 < bytes; b += 2) {
      const __m256 se = clear_bits_sign(c[b]), so = clear_bits_sign(c[b + 1]);
      for (int j = 0; j < G; ++j) {
        const float* xj = x + size_t(j) * ldx;
        even[j] = _mm256_add_ps(even[j], _mm256_xor_ps(_mm256_loadu_ps(xj + 8 * b), se));
        odd[j] = _mm256_add_ps(odd[j], _mm256_xor_ps(_mm256_loadu_ps(xj + 8 * b + 8), so));
      }
    }
    for (int j = 0; j < G; ++j) {
      if (b < bytes)
        even[j] =
            _mm256_add_ps(even[j], _mm256_xor_ps(_mm256_loadu_ps(x + size_t(j) * ldx + 8 * b), clear_bits_sign(c[b])));
      out[size_t(j) * ldo + t] = hsum_avx2(_mm256_add_ps(even[j], odd[j]));
    }
  }
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// sign_dots_avx2 two tokens at a time: lanes 0-7 of a 512-bit sum are its even sum and
// lanes 8-15 its odd one, a pair of bytes of signs the mask of the lanes whose sign flips (a clear bit).
template <int G>
__attribute__((target("avx512f,avx2,fma"))) void sign_dots_avx512(const uint8_t* codes, size_t tokens, size_t stride,
                                                                  const float* x, size_t ldx, int n, float* out,
                                                                  size_t ldo) {
  constexpr int kTokens = 2;
  const int bytes = n / 8, pairs = bytes / 2;
  const __m512i sign = _mm512_set1_epi32(int(0x80000000u));
  for (size_t t0 = 0; t0 < tokens; t0 += kTokens) {
    const int nt = int(std::min<size_t>(kTokens, tokens - t0));
    __m512 acc[kTokens][G];
    for (int u = 0; u < kTokens; ++u)
      for (int j = 0; j < G; ++j) acc[u][j] = _mm512_setzero_ps();
    for (int p = 0; p < pairs; ++p) {
      __m512i xs[G];
      for (int j = 0; j < G; ++j) xs[j] = _mm512_loadu_si512(x + size_t(j) * ldx + 16 * size_t(p));
      for (int u = 0; u < kTokens; ++u) {
        if (u >= nt) break;
        uint16_t bits;
        std::memcpy(&bits, codes + (t0 + size_t(u)) * stride + 2 * size_t(p), 2);
        const __mmask16 clear = static_cast<__mmask16>(~bits);
        for (int j = 0; j < G; ++j)
          acc[u][j] = _mm512_add_ps(acc[u][j], _mm512_castsi512_ps(_mm512_mask_xor_epi32(xs[j], clear, xs[j], sign)));
      }
    }
    for (int u = 0; u < nt; ++u) {
      const uint8_t* c = codes + (t0 + size_t(u)) * stride;
      for (int j = 0; j < G; ++j) {
        __m256 even = _mm512_castps512_ps256(acc[u][j]);
        const __m256 odd = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[u][j]), 1));
        if (bytes % 2)
          even = _mm256_add_ps(even, _mm256_xor_ps(_mm256_loadu_ps(x + size_t(j) * ldx + 8 * size_t(bytes - 1)),
                                                   clear_bits_sign(c[bytes - 1])));
        out[size_t(j) * ldo + t0 + size_t(u)] = hsum_avx2(_mm256_add_ps(even, odd));
      }
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace

void sign_dots(const uint8_t* codes, size_t tokens, size_t stride, const float* x, int n, float* out) {
  sign_dots_group(codes, tokens, stride, x, 0, 1, n, out, 0);
}

void sign_dots_group(const uint8_t* codes, size_t tokens, size_t stride, const float* x, size_t ldx, int g, int n,
                     float* out, size_t ldo) {
  if (cpu_has_avx2())
    return for_query_runs<4>(g, [&](auto G, int j) {
      constexpr int kG = decltype(G)::value;
      (cpu_has_avx512() ? sign_dots_avx512<kG> : sign_dots_avx2<kG>)(codes, tokens, stride, x + size_t(j) * ldx, ldx, n,
                                                                     out + size_t(j) * ldo, ldo);
    });
  for (int j = 0; j < g; ++j) sign_dots_portable(codes, tokens, stride, x + size_t(j) * ldx, n, out + size_t(j) * ldo);
}

}  // namespace kvb
