#include "harness/model/random_model.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "harness/model/gguf_writer.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"

namespace kvb {

const std::vector<ModelShape>& known_model_shapes() {
  static const std::vector<ModelShape> shapes = {
      // name, arch, layers, hidden, heads, kv heads, ffn, vocab, context, theta, eps, tied
      {"llama3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 131072, 500000.0, 1e-5f, false},
      {"mistral-7b", "llama", 32, 4096, 32, 8, 14336, 32000, 32768, 1000000.0, 1e-5f, false},
      {"qwen2-7b", "qwen2", 28, 3584, 28, 4, 18944, 152064, 32768, 1000000.0, 1e-6f, false},
      {"smollm2-135m", "llama", 30, 576, 9, 3, 1536, 49152, 8192, 100000.0, 1e-5f, true},
  };
  return shapes;
}

const ModelShape& model_shape(const std::string& name) {
  std::string known;
  for (const auto& s : known_model_shapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  fail("unknown model shape '{}' (known: {})", name, known);
}

namespace {

// splitmix64: a fast, well-mixed stream per (seed, tensor, block) so tensors fill in parallel.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct TensorPlan {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the input (fastest) dimension
  float scale = 0;           // uniform in [-scale, scale]; 0 means all ones (norm weights)
};

std::vector<TensorPlan> plan(const ModelShape& s) {
  const uint64_t H = s.hidden, F = s.ffn, V = s.vocab, hd = H / s.heads, Q = s.heads * hd, KV = s.kv_heads * hd;
  // Uniform(-a, a) has variance a^2 / 3: a = sqrt(3 / fan_in) keeps unit-variance activations.
  auto mat = [](uint64_t in) { return static_cast<float>(std::sqrt(3.0 / static_cast<double>(in))); };
  std::vector<TensorPlan> p;
  p.push_back({"token_embd.weight", {H, V}, 1.0f});
  p.push_back({"output_norm.weight", {H}, 0.0f});
  if (!s.tied_embeddings) p.push_back({"output.weight", {H, V}, mat(H)});
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    p.push_back({b + "attn_norm.weight", {H}, 0.0f});
    p.push_back({b + "ffn_norm.weight", {H}, 0.0f});
    p.push_back({b + "attn_q.weight", {H, Q}, mat(H)});
    p.push_back({b + "attn_k.weight", {H, KV}, mat(H)});
    p.push_back({b + "attn_v.weight", {H, KV}, mat(H)});
    p.push_back({b + "attn_output.weight", {Q, H}, mat(Q)});
    p.push_back({b + "ffn_gate.weight", {H, F}, mat(H)});
    p.push_back({b + "ffn_up.weight", {H, F}, mat(H)});
    p.push_back({b + "ffn_down.weight", {F, H}, mat(F)});
    if (s.arch == "qwen2") {
      p.push_back({b + "attn_q.bias", {Q}, 0.1f});
      p.push_back({b + "attn_k.bias", {KV}, 0.1f});
      p.push_back({b + "attn_v.bias", {KV}, 0.1f});
    }
  }
  return p;
}

}  // namespace

void write_random_model(const std::string& path, const ModelShape& s, DType type, uint64_t seed) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16)
    fail("random model '{}': weight type {} is not supported (F32, F16 or BF16)", s.name, dtype_name(type));
  if (s.hidden % s.heads != 0 || s.heads % s.kv_heads != 0)
    fail("random model '{}': {} heads / {} KV heads do not divide hidden size {}", s.name, s.heads, s.kv_heads,
         s.hidden);
  GGUFWriter w;
  const std::string a = s.arch + ".";
  w.add_string("general.architecture", s.arch);
  w.add_string("general.name", "random " + s.name);
  w.add_uint32(a + "block_count", static_cast<uint32_t>(s.layers));
  w.add_uint32(a + "context_length", static_cast<uint32_t>(s.context));
  w.add_uint32(a + "embedding_length", static_cast<uint32_t>(s.hidden));
  w.add_uint32(a + "feed_forward_length", static_cast<uint32_t>(s.ffn));
  w.add_uint32(a + "attention.head_count", static_cast<uint32_t>(s.heads));
  w.add_uint32(a + "attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  w.add_uint32(a + "vocab_size", static_cast<uint32_t>(s.vocab));
  w.add_float32(a + "rope.freq_base", static_cast<float>(s.rope_theta));
  w.add_float32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  const auto tensors = plan(s);
  // Norm weights stay F32 as llama.cpp's converters write them.
  for (const auto& t : tensors) w.add_tensor_shape(t.name, t.ne.size() == 1 ? DType::F32 : type, t.ne);

  w.write_streaming(path, [&](size_t i, std::vector<uint8_t>& buf) {
    const TensorPlan& t = tensors[i];
    const bool f32 = t.ne.size() == 1 || type == DType::F32;
    const size_t n = buf.size() / (f32 ? 4 : 2);
    constexpr size_t kBlock = 1 << 16;
    const uint64_t tseed = mix(seed ^ mix(i + 1));
#pragma omp parallel for schedule(static)
    for (size_t b0 = 0; b0 < n; b0 += kBlock) {
      uint64_t state = mix(tseed + b0);
      for (size_t j = b0; j < std::min(n, b0 + kBlock); ++j) {
        state = mix(state);
        // 24 random bits -> [-1, 1)
        const float u = static_cast<float>(state >> 40) * (2.0f / 16777216.0f) - 1.0f;
        const float x = t.scale == 0.0f ? 1.0f : u * t.scale;
        if (f32)
          std::memcpy(buf.data() + 4 * j, &x, 4);
        else {
          const uint16_t h = type == DType::F16 ? float_to_half(x) : float_to_bf16(x);
          std::memcpy(buf.data() + 2 * j, &h, 2);
        }
      }
    }
  });
}

}  // namespace kvb
