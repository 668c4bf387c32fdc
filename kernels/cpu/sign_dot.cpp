#include "kernels/cpu/sign_dot.hpp"

#include "kernels/cpu/avx2.hpp"
#include "kernels/cpu/kv_rows.hpp"

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
// both stay in registers (indexed by parity they lived on the stack).
__attribute__((target("avx2,fma"))) void sign_dots_avx2(const uint8_t* codes, size_t tokens, size_t stride,
                                                        const float* x, int n, float* out) {
  const int bytes = n / 8;
  for (size_t t = 0; t < tokens; ++t) {
    const uint8_t* c = codes + t * stride;
    __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
    int b = 0;
    for (; b + 1 < bytes; b += 2) {
      even = _mm256_add_ps(even, _mm256_xor_ps(_mm256_loadu_ps(x + 8 * b), clear_bits_sign(c[b])));
      odd = _mm256_add_ps(odd, _mm256_xor_ps(_mm256_loadu_ps(x + 8 * b + 8), clear_bits_sign(c[b + 1])));
    }
    if (b < bytes) even = _mm256_add_ps(even, _mm256_xor_ps(_mm256_loadu_ps(x + 8 * b), clear_bits_sign(c[b])));
    out[t] = hsum_avx2(_mm256_add_ps(even, odd));
  }
}

}  // namespace

void sign_dots(const uint8_t* codes, size_t tokens, size_t stride, const float* x, int n, float* out) {
  if (cpu_has_avx2()) return sign_dots_avx2(codes, tokens, stride, x, n, out);
  sign_dots_portable(codes, tokens, stride, x, n, out);
}

}  // namespace kvb
