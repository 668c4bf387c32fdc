#pragma once
// What a compression method sees of one layer after the full-attention prefill, and the hook through
// which it decides what that layer's KV cache keeps.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/kv_rows.hpp"

namespace kvb {

class Engine;
class LayerCache;

// Host-side views, valid during on_layer only. Rows are tokens; heads are contiguous within a row.
struct PrefillView {
  int layer = 0;
  int n_tokens = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  const int32_t* positions = nullptr;  // [n_tokens]
  int window = 0;                      // observation-window length actually provided
  const float* q_window = nullptr;     // [window, n_heads, d] post-RoPE queries of the last tokens
  const float* k = nullptr;            // [n_tokens, n_kv_heads, d] post-RoPE
  const float* k_pre_rope = nullptr;   // [n_tokens, n_kv_heads, d], or null if not requested
  const float* v = nullptr;            // [n_tokens, n_kv_heads, d]
  // [n_heads, n_tokens]: attention each key received, summed over all queries; null if not requested.
  const float* attn_colsum = nullptr;
  // The run's stored dtype: methods build caches in fp32 and the runner stores them at this dtype
  // (LayerCache::store_as); a format that quantizes from full-precision rows reads it to start there.
  KvDtype kv_dtype = KvDtype::F32;
};

struct PrefillNeeds {
  int window = 0;  // observation-window queries wanted
  bool k_pre_rope = false;
  bool attn_colsum = false;  // accumulated attention (H2O)

  // What serves both: one shared prefill keeps what the most demanding of its methods reads.
  void merge(const PrefillNeeds& o) {
    window = std::max(window, o.window);
    k_pre_rope = k_pre_rope || o.k_pre_rope;
    attn_colsum = attn_colsum || o.attn_colsum;
  }
};

// A change of the model's keys and values before attention (DynaKV's learned maps). The engine hands
// it every layer's k and v [n, n_kv_heads x head_dim] of positions pos, in prefill (all prompt tokens;
// pos[0] = 0 starts a sequence) and at each decode step, and attention then reads what it left there.
// Keys are pre-RoPE, or post-RoPE for a transform that acts after the rotation (MatryoshkaKV's
// projections). The caches it fills are the observer's business.
class KvTransform {
 public:
  virtual ~KvTransform() = default;
  virtual void apply(int layer, int n, const int32_t* pos, float* k, float* v) = 0;
  virtual bool after_rope() const { return false; }
};

// The weight matrices of a decoder layer, and where activations enter them: the attention's normed
// input (q, k, v), the attention's output (o), the MLP's normed input (gate, up) and its hidden
// activation (down).
enum class Matrix { Q, K, V, O, Gate, Up, Down };
enum class MatrixInput { Attention, AttentionOutput, Mlp, MlpHidden };
inline constexpr Matrix kMatrices[] = {Matrix::Q,    Matrix::K,  Matrix::V,   Matrix::O,
                                       Matrix::Gate, Matrix::Up, Matrix::Down};
const char* matrix_name(Matrix m);  // "q" .. "down"
const char* matrix_input_name(MatrixInput s);
MatrixInput input_of(Matrix m);
// The model file's tensor of layer l's matrix m (GGUF's names, which ModelFile gives every format).
std::string matrix_tensor(int layer, Matrix m);

// A change of the decoder layers' linear products, weights and the activations entering them, as a
// method that quantizes the model runs them (Atom). Neither the embedding nor the output head changes.
class LinearTransform {
 public:
  virtual ~LinearTransform() = default;
  // Names the weights weights() makes: the engine keeps them while the key is the same. Empty: the
  // model's weights are used as they are and weights() is never called.
  virtual std::string weights_key() const = 0;
  // Layer l's matrix m [rows, cols] (rows: outputs), fp32 as the model file gives it, changed in place.
  virtual void weights(int /*layer*/, Matrix /*m*/, float* /*w*/, int /*rows*/, int /*cols*/) {}
  // False for a layer whose weights stay the model's (weights() is not called for it, and no copy is made).
  virtual bool changes_layer(int /*layer*/) const { return true; }
  // The n rows x[n, cols] entering layer l's matrices at `site`, changed in place (prefill: the prompt's
  // tokens; decoding: the step's token).
  virtual void inputs(int layer, MatrixInput site, float* x, int n, int cols) = 0;
};

class PrefillObserver {
 public:
  virtual ~PrefillObserver() = default;
  virtual PrefillNeeds needs() const { return {}; }
  // Non-null for a method that changes the model's K/V (it then needs a prefill of its own).
  virtual KvTransform* kv_transform() { return nullptr; }
  // Non-null for a method that changes the model's linear products (the same).
  virtual LinearTransform* linear_transform() { return nullptr; }
  // Fills `cache` (empty on entry) with what the layer keeps for decoding.
  virtual void on_layer(const PrefillView& view, LayerCache& cache) = 0;
  // Called at each decode step of the same sequence, per layer, after the step's attention; the new
  // token is already in `cache`. q: its post-RoPE queries [n_heads, head_dim].
  virtual bool acts_on_decode() const { return false; }
  virtual void on_decode(int /*layer*/, LayerCache& /*cache*/, const float* /*q*/, int32_t /*pos*/) {}
  // True for an observer that decides from the whole prompt rather than layer by layer (KVzip scores
  // the context by running the model over it again): the engine then prefills every layer first, calls
  // on_prompt with the prompt's ids, and only then fills the caches through on_layer. on_prompt may run
  // further prefills on `engine`; the prompt's caches are rebuilt after it.
  virtual bool reads_whole_prompt() const { return false; }
  virtual void on_prompt(Engine& /*engine*/, std::span<const int32_t> /*ids*/) {}
};

}  // namespace kvb
