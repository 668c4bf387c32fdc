// kvbench.Model: a model file with its tokenizer and engine; generation, logits and prefill dumps.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "python/src/convert.hpp"

namespace kvb::python {
namespace {

struct Model {
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Engine> engine;
  // The engine runs one call at a time: its caches and buffers are the call's state.
  std::mutex busy;
  std::atomic<std::thread::id> running_on{};

  // Held for a call's whole use of the engine. Calls from other threads wait their turn (the GIL
  // released, so that the running call's Python method can run); a call from the method a running call
  // drives, on its thread, would overwrite that call's caches and is an error instead.
  class Turn {
   public:
    Turn(Model& m, const char* what) : m_(m) {
      if (m.running_on.load() == std::this_thread::get_id())
        fail(
            "{}: this Model is running a call already, which called this one (from a method's compress()?); use "
            "another kvbench.Model for calls made inside a method",
            what);
      {
        py::gil_scoped_release release;
        m.busy.lock();
      }
      m.running_on = std::this_thread::get_id();
    }
    ~Turn() {
      m_.running_on = std::thread::id();
      m_.busy.unlock();
    }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    Model& m_;
  };

  Model(const std::filesystem::path& path, const std::string& backend, Int threads, const std::string& kv_dtype,
        const std::string& weights) {
    if (threads.value < 0) fail("Model: threads {} must be 0 (all cores) or more", threads.value);
    file = ModelFile::open(path.string());
    tok = load_tokenizer(*file);
    EngineOptions o{.backend = backend, .threads = threads.value, .kv_dtype = parse_kv_dtype(kv_dtype, "kv_dtype")};
    if (!weights.empty()) o.weights = parse_weight_format(weights, "weights");
    engine = std::make_unique<Engine>(*file, o);
  }

  std::vector<int32_t> tokenize(const std::string& text, bool chat, bool prompt) const {
    if (chat || prompt) return build_prompt(*file, *tok, text, chat);
    return tok->encode(text);
  }

  // The next-token logits of `ids` ([vocab]); with a method, steps or a continuation, one row per
  // position ([1 + steps, vocab]) as `kvbench logits` computes them (step_logits).
  py::array_t<float> logits(const std::vector<int32_t>& ids, const std::string& method, Int budget,
                            const py::object& params, Int steps_arg, const std::vector<int32_t>& continuation) {
    const Turn turn(*this, "Model.logits");
    const int steps = steps_arg.value;
    if (ids.empty()) fail("Model.logits: no token ids");
    if (steps < 0) fail("Model.logits: steps {} is negative", steps);
    if (!continuation.empty() && steps > 0 && size_t(steps) != continuation.size())
      fail("Model.logits: steps {} but a continuation of {} tokens (give one of them)", steps, continuation.size());
    auto choice = choose_method(method, param_map(params), budget.value, engine->config(), "Model.logits");
    const int n = continuation.empty() ? steps : int(continuation.size());
    StepLogits sl;
    {
      py::gil_scoped_release release;
      sl = step_logits(*engine, ids, n, continuation, choice.runner.get());
    }
    const bool rows = n > 0 || choice.method;
    auto flat = std::make_unique<std::vector<float>>(sl.flat());
    const auto vocab = py::ssize_t(sl.logits[0].size());
    std::vector<py::ssize_t> shape =
        rows ? std::vector<py::ssize_t>{py::ssize_t(sl.logits.size()), vocab} : std::vector<py::ssize_t>{vocab};
    const float* data = flat->data();
    py::capsule owner(flat.release(), [](void* p) { delete static_cast<std::vector<float>*>(p); });
    return py::array_t<float>(shape, data, owner);
  }

  // The prompt positions each cache head of each layer holds after the method's prefill compression.
  py::list kept_positions(const std::string& prompt, const std::string& method, Int budget, const py::object& params,
                          bool chat) {
    const Turn turn(*this, "Model.kept_positions");
    const auto ids = build_prompt(*file, *tok, prompt, chat);
    auto choice = choose_method(method, param_map(params), budget.value, engine->config(), "Model.kept_positions");
    {
      py::gil_scoped_release release;
      engine->prefill(ids, choice.runner.get());
    }
    py::list layers;
    for (const LayerCache& c : engine->caches()) {
      py::list heads;
      for (int h = 0; h < c.n_cache_heads(); ++h) {
        std::vector<int32_t> p;
        for (const auto& seg : c.segments(h)) p.insert(p.end(), seg->positions().begin(), seg->positions().end());
        std::sort(p.begin(), p.end());
        heads.append(py::array_t<int32_t>(py::ssize_t(p.size()), p.data()));
      }
      layers.append(heads);
    }
    return layers;
  }

  py::dict generate(const std::string& prompt, const std::string& method, Int budget, const py::object& params,
                    bool chat, Int max_tokens, const std::vector<std::string>& stop) {
    const Turn turn(*this, "Model.generate");
    const int max_new_tokens = max_tokens.value;
    if (max_new_tokens < 1) fail("Model.generate: max_new_tokens {} must be at least 1", max_new_tokens);
    const auto ids = build_prompt(*file, *tok, prompt, chat);
    GenerateOptions opt;
    opt.max_new_tokens = max_new_tokens;
    opt.stop = stop;
    auto [m, runner] = choose_method(method, param_map(params), budget.value, engine->config(), "Model.generate");
    Generation g;
    {
      py::gil_scoped_release release;
      g = kvb::generate(*engine, *tok, ids, opt, runner.get());
    }
    const size_t full = engine->full_kv_bytes(ids.size());
    const size_t kept = runner ? runner->prefill_kv_bytes() : full;
    py::dict d;
    d["text"] = g.text;
    d["ids"] = g.tokens;
    d["prompt_tokens"] = g.prompt_tokens;
    d["stop_reason"] = g.stop_reason;
    d["tokens_past_context"] = g.past_context;
    d["prefill_seconds"] = g.prefill_seconds;
    d["decode_seconds"] = g.decode_seconds;
    d["compress_seconds"] = runner ? runner->compress_seconds() : 0.0;
    d["kv_bytes"] = kept;
    d["full_kv_bytes"] = full;
    d["method"] = m ? method : "fullkv";
    d["params"] = m ? py::cast(m->params().values()) : py::dict();
    return d;
  }
};

}  // namespace

void bind_model(py::module_& m) {
  py::class_<Model>(m, "Model")
      .def(py::init<const std::filesystem::path&, const std::string&, Int, const std::string&, const std::string&>(),
           py::arg("path"), py::arg("backend") = "cpu", py::arg("threads") = Int{0}, py::arg("kv_dtype") = "fp32",
           py::arg("weights") = "")
      .def("tokenize", &Model::tokenize, py::arg("text"), py::arg("chat") = false, py::arg("prompt") = false)
      .def(
          "detokenize",
          [](const Model& md, const std::vector<int32_t>& ids, bool skip_special) {
            return utf8_lossy(md.tok->decode(ids, skip_special));
          },
          py::arg("ids"), py::arg("skip_special") = false)
      .def("logits", &Model::logits, py::arg("ids"), py::arg("method") = "", py::arg("budget") = Int{0},
           py::arg("params") = py::none(), py::arg("steps") = Int{0}, py::arg("continuation") = std::vector<int32_t>{})
      .def("kept_positions", &Model::kept_positions, py::arg("prompt"), py::arg("method"), py::arg("budget") = Int{0},
           py::arg("params") = py::none(), py::arg("chat") = true)
      .def("generate", &Model::generate, py::arg("prompt"), py::arg("method") = "", py::arg("budget") = Int{0},
           py::arg("params") = py::none(), py::arg("chat") = true, py::arg("max_new_tokens") = Int{128},
           py::arg("stop") = std::vector<std::string>{})
      .def_property_readonly("config", [](const Model& md) {
        const ModelConfig& c = md.engine->config();
        py::dict d;
        d["n_layers"] = c.n_layers;
        d["n_heads"] = c.n_heads;
        d["n_kv_heads"] = c.n_kv_heads;
        d["head_dim"] = c.head_dim;
        d["vocab_size"] = c.vocab_size;
        return d;
      });
}

}  // namespace kvb::python
