#include "harness/model/random_model.hpp"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include "harness/model/gguf_writer.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/quantize.hpp"

namespace kvb {

const std::vector<ModelShape>& known_model_shapes() {
  static const std::vector<ModelShape> shapes = {
      // name, arch, layers, hidden, heads, kv heads, ffn, vocab, context, theta, eps, tied[, head_dim]
      {"llama3-8b", "llama", 32, 4096, 32, 8, 14336, 128256, 131072, 500000.0, 1e-5f, false},
      {"mistral-7b", "llama", 32, 4096, 32, 8, 14336, 32000, 32768, 1000000.0, 1e-5f, false},
      {"qwen2-7b", "qwen2", 28, 3584, 28, 4, 18944, 152064, 32768, 1000000.0, 1e-6f, false},
      {"smollm2-135m", "llama", 30, 576, 9, 3, 1536, 49152, 8192, 100000.0, 1e-5f, true},
      {"qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 3072, 151936, 40960, 1000000.0, 1e-6f, true, 128},
      {"qwen3-8b", "qwen3", 36, 4096, 32, 8, 12288, 151936, 40960, 1000000.0, 1e-6f, false},
      {"qwen3-14b", "qwen3", 40, 5120, 40, 8, 17408, 151936, 40960, 1000000.0, 1e-6f, false},
      {"falcon-7b", "falcon", 32, 4544, 71, 1, 18176, 65024, 2048, 10000.0, 1e-5f, true},
      {"phi3-mini-4k", "phi3", 32, 3072, 32, 32, 8192, 32064, 4096, 10000.0, 1e-5f, false},
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
  const uint64_t H = s.hidden, F = s.ffn, V = s.vocab, hd = s.head_dim ? s.head_dim : H / s.heads, Q = s.heads * hd,
                 KV = s.kv_heads * hd;
  // Uniform(-a, a) has variance a^2 / 3: a = sqrt(3 / fan_in) keeps unit-variance activations.
  auto mat = [](uint64_t in) { return static_cast<float>(std::sqrt(3.0 / static_cast<double>(in))); };
  const bool falcon = s.arch == "falcon", phi3 = s.arch == "phi3";
  std::vector<TensorPlan> p;
  // A norm's weight (ones), and Falcon's LayerNorm bias.
  auto norm = [&](const std::string& name) {
    p.push_back({name + ".weight", {H}, 0.0f});
    if (falcon) p.push_back({name + ".bias", {H}, 0.1f});
  };
  p.push_back({"token_embd.weight", {H, V}, 1.0f});
  norm("output_norm");
  if (!s.tied_embeddings) p.push_back({"output.weight", {H, V}, mat(H)});
  for (int l = 0; l < s.layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    norm(b + "attn_norm");
    if (!falcon) norm(b + "ffn_norm");
    if (falcon || phi3) {  // fused as llama.cpp stores them: [Q; K; V], and [gate; up] for Phi-3
      p.push_back({b + "attn_qkv.weight", {H, Q + 2 * KV}, mat(H)});
    } else {
      p.push_back({b + "attn_q.weight", {H, Q}, mat(H)});
      p.push_back({b + "attn_k.weight", {H, KV}, mat(H)});
      p.push_back({b + "attn_v.weight", {H, KV}, mat(H)});
    }
    p.push_back({b + "attn_output.weight", {Q, H}, mat(Q)});
    if (!falcon && !phi3) p.push_back({b + "ffn_gate.weight", {H, F}, mat(H)});
    p.push_back({b + "ffn_up.weight", {H, phi3 ? 2 * F : F}, mat(H)});
    p.push_back({b + "ffn_down.weight", {F, H}, mat(F)});
    if (s.arch == "qwen2") {
      p.push_back({b + "attn_q.bias", {Q}, 0.1f});
      p.push_back({b + "attn_k.bias", {KV}, 0.1f});
      p.push_back({b + "attn_v.bias", {KV}, 0.1f});
    }
    if (s.arch == "qwen3") {
      p.push_back({b + "attn_q_norm.weight", {hd}, 0.0f});
      p.push_back({b + "attn_k_norm.weight", {hd}, 0.0f});
    }
  }
  return p;
}

bool is_kquant(DType t) { return t == DType::Q4_K || t == DType::Q6_K; }

// Q4_K models follow llama.cpp's Q4_K_M: attn_v, ffn_down and the output head in Q6_K (llama.cpp
// gives Q6_K to some of the attn_v and ffn_down layers only), the other matrices in Q4_K.
DType tensor_type(const TensorPlan& t, DType type) {
  if (t.ne.size() == 1) return DType::F32;
  if (type != DType::Q4_K) return type;
  auto ends = [&](const std::string& suffix) {
    return t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return t.name == "output.weight" || ends("attn_v.weight") || ends("ffn_down.weight") ? DType::Q6_K : DType::Q4_K;
}

}  // namespace

void write_random_model(const std::string& path, const ModelShape& s, DType type, uint64_t seed) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16 && type != DType::Q4_K)
    fail("random model '{}': weight type {} is not supported (F32, F16, BF16 or Q4_K)", s.name, dtype_name(type));
  if ((!s.head_dim && s.hidden % s.heads != 0) || s.heads % s.kv_heads != 0)
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
  if (s.head_dim) {
    w.add_uint32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
    w.add_uint32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  }
  w.add_float32(a + "rope.freq_base", static_cast<float>(s.rope_theta));
  w.add_float32(a + (s.arch == "falcon" ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon"),
                s.rms_eps);
  // No tokenizer: llama.cpp then loads the file too (its "no_vocab" models), for speed comparisons.
  w.add_string("tokenizer.ggml.model", "no_vocab");
  const auto tensors = plan(s);
  std::vector<DType> types;
  for (const auto& t : tensors) {
    types.push_back(tensor_type(t, type));
    if (is_kquant(types.back()) && t.ne[0] % 256)
      fail(
          "random model '{}': {} has rows of {} values, not whole {} blocks of 256 (choose a shape whose sizes are "
          "multiples of 256)",
          s.name, t.name, t.ne[0], dtype_name(types.back()));
  }
  // Norm weights stay F32 as llama.cpp's converters write them.
  for (size_t i = 0; i < tensors.size(); ++i) w.add_tensor_shape(tensors[i].name, types[i], tensors[i].ne);

  w.write_streaming(path, [&](size_t i, std::vector<uint8_t>& buf) {
    const TensorPlan& t = tensors[i];
    const DType tt = types[i];
    const size_t n = std::accumulate(t.ne.begin(), t.ne.end(), size_t(1), std::multiplies<>());
    constexpr size_t kBlock = 1 << 16;  // a whole number of K-quant blocks
    const uint64_t tseed = mix(seed ^ mix(i + 1));
#pragma omp parallel for schedule(static)
    for (size_t b0 = 0; b0 < n; b0 += kBlock) {
      const size_t len = std::min(n, b0 + kBlock) - b0;
      std::vector<float> x(len);
      uint64_t state = mix(tseed + b0);
      for (size_t j = 0; j < len; ++j) {
        state = mix(state);
        // 24 random bits -> [-1, 1)
        const float u = static_cast<float>(state >> 40) * (2.0f / 16777216.0f) - 1.0f;
        x[j] = t.scale == 0.0f ? 1.0f : u * t.scale;
      }
      if (is_kquant(tt)) {
        quantize_kquant(tt, x.data(), buf.data() + b0 / 256 * dtype_info(tt).block_bytes, len);
      } else if (tt == DType::F32) {
        std::memcpy(buf.data() + 4 * b0, x.data(), 4 * len);
      } else {
        for (size_t j = 0; j < len; ++j) {
          const uint16_t h = tt == DType::F16 ? float_to_half(x[j]) : float_to_bf16(x[j]);
          std::memcpy(buf.data() + 2 * (b0 + j), &h, 2);
        }
      }
    }
  });
}

}  // namespace kvb
