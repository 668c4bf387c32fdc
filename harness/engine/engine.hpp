#pragma once
// The transformer: Llama-family forward pass (RMSNorm, RoPE, GQA attention, SwiGLU MLP, tied or
// separate output head, optional q/k/v bias) over a Backend. Prefill runs the whole prompt layer by
// layer with full attention and hands each layer's K/V to an observer that fills the KV cache;
// decode appends one token at a time and attends over that cache.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/backend.hpp"
#include "harness/engine/prefill_view.hpp"
#include "harness/model/config.hpp"

namespace kvb {

class ModelFile;

// log softmax(logits)[target], in double.
double log_softmax_at(std::span<const float> logits, int32_t target);

// What a full-attention prefill leaves for compression methods, kept so that several methods can be
// applied to one prefill (experiment sweeps): per layer the views a PrefillObserver receives.
struct PrefillCapture {
  int n_tokens = 0;
  std::vector<int32_t> ids;
  PrefillNeeds needs;
  std::vector<int32_t> positions;
  std::vector<float> logits;  // of the last prompt token (independent of the cache kept)
  std::vector<std::vector<float>> k, v, k_pre_rope, q_window, attn_colsum;  // per layer
  int window = 0;
};

struct EngineOptions {
  std::string backend = "cpu";
  int threads = 0;       // 0: all cores
  int mlp_chunk = 2048;  // tokens per MLP block during prefill (bounds the [chunk, ffn] buffers)
  // What the KV cache stores full-precision numbers as. Prefill attention is always exact (fp32).
  KvDtype kv_dtype = KvDtype::F32;
  // How weight matrices are stored (backend.hpp); unset: the backend's own (CPU fp32, CUDA bf16).
  std::optional<WeightFormat> weights = std::nullopt;
};

// One sequence's decoding state: its caches, its position and the method acting on its decoding
// (which must outlive it). The engine decodes its current sequence, the one prefill and resume start;
// Engine::detach hands that one out so that several sequences can decode together (decode_batch).
class Sequence {
 public:
  int position() const { return pos_; }
  const std::vector<LayerCache>& caches() const { return caches_; }
  size_t kv_bytes() const;

 private:
  friend class Engine;
  std::vector<LayerCache> caches_;
  int pos_ = 0;
  PrefillObserver* observer_ = nullptr;  // the method, if it acts on decoding
  KvTransform* transform_ = nullptr;     // the method's, if it changes the model's K/V
  LinearTransform* linear_ = nullptr;    // the method's, if it changes the model's linear products
};

class Engine {
 public:
  Engine(const ModelFile& model, const EngineOptions& opt = {});
  ~Engine();

  const ModelConfig& config() const { return cfg_; }
  // The file the engine was built from (it must outlive the engine): its tokenizer and chat template,
  // for observers that build prompts of their own (KVzip).
  const ModelFile& model_file() const { return model_; }
  Backend& backend() { return *backend_; }
  KvDtype kv_dtype() const { return opt_.kv_dtype; }
  WeightFormat weight_format() const { return backend_->weight_format(); }

  // Starts a new sequence with `ids` (positions 0..n-1) and returns the logits of the last token.
  // Without an observer every layer keeps its full K/V. An observer that reads the whole prompt
  // (PrefillObserver::reads_whole_prompt) is served by prefill_capture and resume. The observer, if it acts on
  // decoding, is also called at every decode step of this sequence and must outlive it. With
  // `next_logprobs`, also the log-probability of each ids[t + 1] given ids[0..t] (n - 1 values, the
  // prefill's own attention: a method changes them only by changing the model).
  std::vector<float> prefill(std::span<const int32_t> ids, PrefillObserver* observer = nullptr,
                             std::vector<double>* next_logprobs = nullptr);
  // Decoder layers [first, last) of a prefill of `ids`, from the hidden states entering layer `first` in
  // `hidden` ([n, hidden size]; unread when first is 0: the embeddings), which it leaves holding those leaving
  // layer last - 1. An offline step that goes layer by layer (GPTQ: layer l's Hessians are taken with the
  // layers before it already quantized) keeps each window's states rather than running those layers again.
  // The observer sees these layers as in prefill; no logits, and no sequence is left to decode.
  void prefill_layers(std::span<const int32_t> ids, int first, int last, std::vector<float>& hidden,
                      PrefillObserver* observer);
  // Appends one token and returns its logits.
  std::vector<float> decode(int32_t token);
  // Hands out the current sequence (as prefill or resume left it); the engine then holds none.
  Sequence detach();
  // One decode step of several sequences at once: tokens[b] is appended to seqs[b] (each its own
  // cache, method and position), returning each one's logits, bit for bit those that decode() gives
  // the sequence alone, while each weight matrix is read once for the whole batch. More than one
  // sequence needs a backend that decodes batches (the CPU's); the sequences must be distinct.
  std::vector<std::vector<float>> decode_batch(std::span<Sequence* const> seqs, std::span<const int32_t> tokens);

  // A prefill whose per-layer views (as much as `needs` asks) are kept instead of filling caches.
  // Given a capture of a prefix of `ids` (with what `needs` asks; see continues_prefill), only the rest
  // of the prompt (at least one token) is computed, attending over the prefix's kept keys and values: the prefix's rows
  // are the same in any prompt that starts with it, so the capture equals a whole prefill's (to rounding: each
  // attention row is computed as in it, and the accumulated attention sums the two parts).
  PrefillCapture prefill_capture(std::span<const int32_t> ids, const PrefillNeeds& needs,
                                 std::vector<double>* next_logprobs = nullptr, const PrefillCapture* prefix = nullptr);
  // Whether prefill_capture can continue from a prefix's capture on this backend.
  bool continues_prefill() const { return backend_->continues_prefill(); }
  // Starts a sequence from a capture as if `prefill(ids, observer)` had run: the observer (or the
  // full cache) fills each layer's cache from the captured views; returns the last token's logits.
  std::vector<float> resume(const PrefillCapture& capture, PrefillObserver* observer = nullptr);

  int position() const { return seq_.pos_; }
  // Seconds spent so far in observers' KV and linear transforms (DynaKV's gates and reconstructions,
  // Atom's quantized activations and the making of its weights), host copies included: the cost of a
  // method that changes the model.
  double transform_seconds() const { return transform_seconds_; }
  const std::vector<LayerCache>& caches() const { return seq_.caches_; }
  std::vector<LayerCache>& caches() { return seq_.caches_; }
  size_t kv_bytes() const;
  // Bytes of the uncompressed cache for `tokens` tokens (K and V of every KV head and layer, at the
  // cache's dtype).
  size_t full_kv_bytes(size_t tokens) const;
  size_t weight_bytes() const { return weight_bytes_; }
  // Working memory decode_batch allocates per sequence of a batch (activations, logits, host copies).
  size_t decode_buffer_bytes() const;
  // Weight bytes one decode step reads: all of them but the embedding table, of which it reads one
  // row (unless the table is also the output head).
  size_t decode_weight_bytes() const { return weight_bytes_ - (cfg_.tied_embeddings ? 0 : tok_embd_.bytes()); }

 private:
  struct Matrices;
  struct Layer;
  std::vector<float> run_prefill(std::span<const int32_t> ids, PrefillObserver* observer,
                                 std::vector<double>* next_logprobs, const PrefillCapture* past);
  // run_prefill's layers [first, last) from and into host hidden states (prefill_layers).
  struct LayerRange {
    int first = 0, last = 0;
    std::vector<float>* hidden = nullptr;
  };
  std::vector<float> run_prefill(std::span<const int32_t> ids, PrefillObserver* observer,
                                 std::vector<double>* next_logprobs, const PrefillCapture* past,
                                 const LayerRange& range);
  std::vector<float> logits_of_last(const Buffer& x, int n);
  // The output head over each of n rows of x, tokens of n sequences (Backend::linear_tokens), through
  // the working buffers h [n, hidden] and logits [n, vocabulary].
  std::vector<std::vector<float>> logits_of_rows(const Buffer& x, int n, Buffer& h, Buffer& logits);
  // The output head over every row of x but the last, in chunks: log p(ids[t + 1]) for t < n - 1.
  std::vector<double> next_token_logprobs(const Buffer& x, std::span<const int32_t> ids);
  // q, k, v of n rows of normed hidden states h: the projections (with bias), then Qwen3's per-head
  // q/k RMSNorm.
  // `apart`: the n rows are tokens of n sequences (decoding), multiplied by Backend::linear_tokens.
  // The linear transforms of the pass (linear_pass_) change h first.
  void project_qkv(int l, Buffer& h, int n, Buffer& q, Buffer& k, Buffer& v, bool apart = false);
  // The model's norm (RMSNorm, or LayerNorm with its bias) of n rows of x from row x_row.
  struct Norm;
  void norm(const Norm& w, const Buffer& x, int n, Buffer& y, size_t x_row = 0);
  // The norm in front of the MLP (the attention's own in Falcon-7B's parallel block).
  const Norm& mlp_norm(const Layer& L) const;
  // out = down(swiglu(gate(in), up(in))) or down(gelu(up(in))) for n rows; gate/up/act hold n x F. The
  // linear transforms of the pass change in and act first.
  void mlp(int l, Buffer& in, int n, Buffer& gate, Buffer& up, Buffer& act, Buffer& out, bool apart = false);
  // Several products of the same x: Backend::linear_tokens_shared when `apart`, else linear for each.
  void linears(const Buffer& x, std::span<const Backend::Product> ps, int n, int in, bool apart);
  // y = x W^T for n rows: one sequence's tokens (prefill) or, `apart`, one token of each of n sequences.
  void linear(const Buffer& x, const Weight& w, const Buffer* bias, int n, int in, int out, Buffer& y, bool apart);
  void append_token(LayerCache& cache, const float* k, const float* v, int32_t pos);

  const ModelFile& model_;
  ModelConfig cfg_;
  std::unique_ptr<Backend> backend_;
  EngineOptions opt_;
  Weight tok_embd_, output_;
  std::unique_ptr<Norm> out_norm_;
  std::vector<Layer> layers_;
  Sequence seq_;  // the current sequence
  size_t weight_bytes_ = 0;
  // Applies the sequences' transforms (those applied `after_rope` or before it) to layer l's rows of k
  // and v in backend memory, a round trip through the host. The rows (one per position) are split
  // evenly among the sequences: one sequence's prompt, or one token of each; null ones are left alone.
  void transform(int l, Buffer& k, Buffer& v, std::span<const int32_t> pos, std::span<KvTransform* const> transforms,
                 bool after_rope);
  void reset_caches();
  // The pass's linear transforms, one per sequence (null: none): the weights they make are used from
  // now on (made whenever their key changes, in the backend's weight format), and change_inputs applies
  // them. An Error if the sequences' weights differ.
  void use_linear_transforms(std::span<LinearTransform* const> ts);
  // Applies the pass's linear transforms to x [n, cols] entering layer l's matrices at `site`, a round
  // trip through the host; the rows are split evenly among the sequences, as in transform().
  void change_inputs(int l, MatrixInput site, Buffer& x, int n, int cols);
  // Layer l's matrices as the pass runs them.
  const Matrices& matrices(int l) const;
  std::vector<LinearTransform*> linear_pass_;
  std::vector<Matrices> changed_;    // the weights of changed_key_ (the layers changed_layer_ marks)
  std::vector<bool> changed_layer_;  // which layers changed_ holds (the others run the model's)
  std::string changed_key_;
  bool changed_active_ = false;
  std::vector<float> tk_, tv_, tx_;
  double transform_seconds_ = 0;
  std::vector<float> rep_k_, rep_v_;
  // decode_batch's working buffers for a batch of `batch` sequences, kept from step to step: allocated
  // per step, they were a dozen allocations and frees a token, each sweeping the allocator's free lists.
  struct DecodeBuffers {
    int batch = 0;
    Buffer x, h, q, k, v, attn, proj, mlp_out, gate, up, act, head_h, logits;
    std::vector<float> hk, hv;
  };
  DecodeBuffers& decode_buffers(int batch);
  DecodeBuffers decode_;
};

}  // namespace kvb
