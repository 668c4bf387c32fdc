// The Python module kvbench._kvbench: the native engine, registries, sweeps and metrics for Python
// (python/kvbench/__init__.py wraps it). Arrays the engine owns are handed out as read-only numpy
// views without copies; methods written in Python (kvbench.Method) join the native method registry.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/method/method.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/report/stats.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "tasks/longbench/jieba.hpp"
#include "tasks/longbench/metrics.hpp"
#include "tasks/niah/niah.hpp"
#include "tasks/ruler/ruler.hpp"
#include "tasks/task.hpp"

namespace py = pybind11;
using json = nlohmann::json;

namespace kvb::python {
namespace {

// ---- JSON <-> Python ----

py::object to_py(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return py::none();
    case json::value_t::boolean: return py::bool_(j.get<bool>());
    case json::value_t::number_integer: return py::int_(j.get<int64_t>());
    case json::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case json::value_t::number_float: return py::float_(j.get<double>());
    case json::value_t::string: return py::str(j.get_ref<const std::string&>());
    case json::value_t::array: {
      py::list l;
      for (const auto& x : j) l.append(to_py(x));
      return l;
    }
    case json::value_t::object: {
      py::dict d;
      for (const auto& [k, v] : j.items()) d[py::str(k)] = to_py(v);
      return d;
    }
    default: return py::none();
  }
}

// A parameter value as the registries read it (text): 5 -> "5", True -> "true".
std::string param_text(const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  return py::str(v).cast<std::string>();
}

std::map<std::string, std::string> param_map(const py::object& params) {
  std::map<std::string, std::string> out;
  if (params.is_none()) return out;
  for (const auto& [k, v] : params.cast<py::dict>()) out[py::str(k).cast<std::string>()] = param_text(v);
  return out;
}

// A read-only numpy view of memory someone else owns for as long as `owner` lives.
template <typename T>
py::array view(const T* data, std::vector<py::ssize_t> shape, py::handle owner) {
  py::array a(py::dtype::of<T>(), shape, data, owner);
  py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return a;
}

py::list param_list(const std::vector<ParamSpec>& specs) {
  static const char* types[] = {"int", "float", "bool", "choice", "text"};
  py::list l;
  for (const auto& p : specs) {
    py::dict d;
    d["name"] = p.name;
    d["type"] = types[static_cast<int>(p.type)];
    d["default"] = p.default_value;
    if (p.type == ParamSpec::Type::Int || p.type == ParamSpec::Type::Float) d["range"] = py::make_tuple(p.min, p.max);
    if (p.type == ParamSpec::Type::Choice) d["choices"] = p.choices;
    d["help"] = p.help;
    l.append(d);
  }
  return l;
}

// ---- The layer a Python method sees ----

// What compress(view, budget) receives: the layer's prefill as numpy views, valid during the call.
struct LayerView {
  const PrefillView* v = nullptr;
  GqaMode gqa = GqaMode::Native;
  int window = 0;  // the method's own observation window (the prefill may hold more rows)

  const PrefillView& get() const {
    if (!v) fail("this LayerView is no longer valid: views are valid only during compress(); copy what you keep");
    return *v;
  }
  // The method's window rows: the last `window` of those the prefill kept.
  const float* queries() const {
    const auto& p = get();
    return p.q_window + size_t(p.window - window) * size_t(p.n_heads) * size_t(p.head_dim);
  }
};

py::array window_attention(const LayerView& lv) {
  // softmax(q k^T / sqrt(d)) of the window rows over every key, causal inside the window: [Hq, w, S].
  const PrefillView& v = lv.get();
  const int S = v.n_tokens, w = lv.window, H = v.n_heads, d = v.head_dim, group = v.n_heads / v.n_kv_heads;
  py::array_t<float> out({py::ssize_t(H), py::ssize_t(w), py::ssize_t(S)});
  float* o = out.mutable_data();
  const float* q = lv.queries();
  const float scale = 1.0f / std::sqrt(float(d));
  for (int h = 0; h < H; ++h)
    for (int r = 0; r < w; ++r) {
      float* row = o + (size_t(h) * w + r) * S;
      const float* qr = q + (size_t(r) * H + h) * d;
      const int last = S - w + r;  // the row's own position: keys after it are masked
      float mx = -INFINITY;
      for (int j = 0; j < S; ++j) {
        if (j > last) {
          row[j] = 0;
          continue;
        }
        const float* k = v.k + (size_t(j) * v.n_kv_heads + h / group) * d;
        float s = 0;
        for (int x = 0; x < d; ++x) s += qr[x] * k[x];
        row[j] = s * scale;
        mx = std::max(mx, row[j]);
      }
      double sum = 0;
      for (int j = 0; j <= last; ++j) sum += (row[j] = std::exp(row[j] - mx));
      for (int j = 0; j <= last; ++j) row[j] = float(row[j] / sum);
    }
  return out;
}

// ---- Methods written in Python ----

class PyMethod final : public Method {
 public:
  explicit PyMethod(py::object instance) : inst_(std::move(instance)) {}
  ~PyMethod() override {
    py::gil_scoped_acquire gil;
    inst_ = py::object();
  }

  void setup() override {
    py::gil_scoped_acquire gil;
    py::dict p;
    for (const auto& spec : MethodRegistry::get().param_specs(name())) {
      const std::string& text = params().get(spec.name);
      switch (spec.type) {
        case ParamSpec::Type::Int: p[py::str(spec.name)] = params().get_int(spec.name); break;
        case ParamSpec::Type::Float: p[py::str(spec.name)] = params().get_float(spec.name); break;
        case ParamSpec::Type::Bool: p[py::str(spec.name)] = params().get_bool(spec.name); break;
        default: p[py::str(spec.name)] = text;
      }
    }
    inst_.attr("params") = p;
    const py::object n = call("needs", [&] { return inst_.attr("needs")(); }, -1);
    if (!py::isinstance<py::dict>(n)) fail("python method {}: needs() must return a dict", name());
    for (const auto& [k, val] : n.cast<py::dict>()) {
      const std::string key = py::str(k).cast<std::string>();
      if (key == "window") needs_.window = val.cast<int>();
      else if (key == "attn_colsum") needs_.attn_colsum = val.cast<bool>();
      else if (key == "k_pre_rope") needs_.k_pre_rope = val.cast<bool>();
      else fail("python method {}: needs() returned unknown key '{}' (window, attn_colsum, k_pre_rope)", name(), key);
    }
    if (needs_.window < 0) fail("python method {}: needs() window {} is negative", name(), needs_.window);
  }
  PrefillNeeds needs() const override { return needs_; }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    py::gil_scoped_acquire gil;
    const int S = v.n_tokens, T = b.tokens, heads = stored_heads();
    // Python owns the view object; once the call returns it refuses use instead of reading memory the
    // engine has moved on from.
    py::object handle = py::cast(LayerView{&v, gqa(), std::min(needs_.window, S)});
    py::object out = call("compress", [&] { return inst_.attr("compress")(handle, T); }, v.layer);
    handle.cast<LayerView&>().v = nullptr;
    const std::string where = fmt::format("python method {}, layer {}", name(), v.layer);
    std::vector<std::vector<int32_t>> keep;
    py::array arr;
    if (py::isinstance<py::array>(out)) {
      arr = out.cast<py::array>();
    } else if (py::isinstance<py::list>(out) || py::isinstance<py::tuple>(out)) {
      // One array of positions per stored head (heads may keep different counts).
      py::sequence seq = out.cast<py::sequence>();
      if (py::ssize_t(seq.size()) != heads)
        fail("{}: compress returned {} position lists; expected one per stored head ({})", where, seq.size(), heads);
      for (size_t h = 0; h < seq.size(); ++h) keep.push_back(positions(py::array::ensure(seq[h]), where, S, T, int(h)));
      return gather(v, gqa(), keep);
    } else {
      fail("{}: compress returned {}; expected a numpy array (int positions [heads, k] or float scores [heads, S - "
           "window]) or a list of int arrays, one per stored head",
           where, py::str(py::type::of(out)).cast<std::string>());
    }
    const char kind = arr.dtype().kind();
    if (kind == 'i' || kind == 'u') {
      if (arr.ndim() != 2 || arr.shape(0) != heads)
        fail("{}: compress returned positions of shape {}; expected [{} stored heads, k]", where, shape_text(arr), heads);
      for (int h = 0; h < heads; ++h) keep.push_back(positions(arr[py::int_(h)].cast<py::array>(), where, S, T, h));
      return gather(v, gqa(), keep);
    }
    if (kind != 'f')
      fail("{}: compress returned an array of dtype {}; expected int positions or float scores", where,
           py::str(arr.dtype()).cast<std::string>());
    // Scores of the prefix [0, S - w) per head; the shared top-k keeps the best T - w plus the window.
    const int w = needs_.window;
    if (w >= T) fail("{}: the window {} leaves no room in KV size {}", where, w, T);
    const int H = v.n_heads, G = v.n_kv_heads;
    if (arr.ndim() != 2 || (arr.shape(0) != H && arr.shape(0) != G) || arr.shape(1) != S - w)
      fail("{}: compress returned scores of shape {}; expected [{} query heads or {} KV heads, {} = S - window]", where,
           shape_text(arr), H, G, S - w);
    auto f = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(arr);
    HeadScores q(size_t(H), std::vector<float>(size_t(S - w)));
    const bool per_kv = arr.shape(0) != H;
    for (int h = 0; h < H; ++h) {
      const float* row = f.data(per_kv ? h / (H / G) : h);
      for (int j = 0; j < S - w; ++j) {
        if (!std::isfinite(row[j])) fail("{}: score {} of head {} is not finite", where, j, h);
        q[size_t(h)][size_t(j)] = row[j];
      }
    }
    const Selection sel = select_top(std::move(q), G, gqa(), std::vector<int>(size_t(heads), T - w), S, w);
    return gather(v, gqa(), sel.keep);
  }

 private:
  template <typename F>
  py::object call(const char* what, F&& f, int layer) {
    try {
      return f();
    } catch (py::error_already_set& e) {
      fail("python method {}{}: {}() raised {}", name(), layer >= 0 ? fmt::format(", layer {}", layer) : "", what,
           e.what());
    }
  }
  static std::string shape_text(const py::array& a) {
    std::string s = "[";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
    return s + "]";
  }
  static std::vector<int32_t> positions(const py::array& a, const std::string& where, int S, int T, int head) {
    if (!a || a.ndim() != 1 || (a.dtype().kind() != 'i' && a.dtype().kind() != 'u'))
      fail("{}: head {}: positions must be a 1-D integer array", where, head);
    auto ints = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
    std::vector<int32_t> p;
    for (py::ssize_t i = 0; i < ints.size(); ++i) {
      const int64_t x = ints.at(i);
      if (x < 0 || x >= S) fail("{}: head {}: position {} is out of range [0, {})", where, head, x, S);
      p.push_back(int32_t(x));
    }
    std::sort(p.begin(), p.end());
    if (std::adjacent_find(p.begin(), p.end()) != p.end()) fail("{}: head {}: a position is listed twice", where, head);
    if (int(p.size()) > T) fail("{}: head {} keeps {} positions, more than the KV size {}", where, head, p.size(), T);
    return p;
  }

  py::object inst_;
  PrefillNeeds needs_;
};

// Registers a kvbench.Method subclass under `name` with parameters given as {name: default}; the
// type of each default (int, float, bool, str) is the parameter's type.
void register_python_method(py::object cls, const std::string& name, py::dict params, const std::string& summary) {
  if (name.empty()) fail("kvbench.register: a method needs a name");
  std::vector<ParamSpec> specs;
  for (const auto& [k, v] : params) {
    const std::string key = py::str(k).cast<std::string>();
    if (key == "gqa") fail("kvbench.register {}: 'gqa' is every method's parameter already", name);
    if (py::isinstance<py::bool_>(v)) specs.push_back(ParamSpec::boolean(key, v.cast<bool>(), ""));
    else if (py::isinstance<py::int_>(v)) specs.push_back(ParamSpec::integer(key, v.cast<long>(), -(1L << 40), 1L << 40, ""));
    else if (py::isinstance<py::float_>(v)) specs.push_back(ParamSpec::real(key, v.cast<double>(), -1e300, 1e300, ""));
    else if (py::isinstance<py::str>(v)) specs.push_back(ParamSpec::text(key, v.cast<std::string>(), ""));
    else fail("kvbench.register {}: parameter '{}' has a default of type {}; expected int, float, bool or str", name, key,
              py::str(py::type::of(v)).cast<std::string>());
  }
  // The class lives as long as the process: the registry outlives the interpreter's own teardown.
  cls.inc_ref();
  PyObject* raw = cls.ptr();
  MethodInfo info{name, summary.empty() ? "written in Python" : summary, specs, [raw, name] {
                    py::gil_scoped_acquire gil;
                    try {
                      return std::unique_ptr<Method>(
                          std::make_unique<PyMethod>(py::reinterpret_borrow<py::object>(raw)()));
                    } catch (py::error_already_set& e) {
                      fail("python method {}: constructing it raised {}", name, e.what());
                    }
                  }};
  MethodRegistry::get().add(std::move(info));
}

// ---- The model ----

struct Model {
  std::unique_ptr<ModelFile> file;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Engine> engine;

  Model(const std::string& path, const std::string& backend, int threads, const std::string& kv_dtype,
        const std::string& weights) {
    file = ModelFile::open(path);
    tok = load_tokenizer(*file);
    EngineOptions o{.backend = backend, .threads = threads, .kv_dtype = parse_kv_dtype(kv_dtype, "kv_dtype")};
    if (!weights.empty()) o.weights = parse_weight_format(weights, "weights");
    engine = std::make_unique<Engine>(*file, o);
  }

  std::vector<int32_t> tokenize(const std::string& text, bool chat, bool prompt) const {
    if (chat || prompt) return build_prompt(*file, *tok, text, chat);
    return tok->encode(text);
  }

  // The next-token logits of `ids` ([vocab]); with a method, steps or a continuation, one row per
  // position ([1 + steps, vocab]) as `kvbench logits` computes them (step_logits).
  py::array_t<float> logits(const std::vector<int32_t>& ids, const std::string& method, int budget,
                            const py::object& params, int steps, const std::vector<int32_t>& continuation) {
    if (ids.empty()) fail("Model.logits: no token ids");
    if (steps < 0) fail("Model.logits: steps {} is negative", steps);
    if (!continuation.empty() && steps > 0 && size_t(steps) != continuation.size())
      fail("Model.logits: steps {} but a continuation of {} tokens (give one of them)", steps, continuation.size());
    auto choice = choose_method(method, param_map(params), budget, engine->config(), "Model.logits");
    const int n = continuation.empty() ? steps : int(continuation.size());
    StepLogits sl;
    {
      py::gil_scoped_release release;
      sl = step_logits(*engine, ids, n, continuation, choice.runner.get());
    }
    const bool rows = n > 0 || choice.method;
    auto flat = std::make_unique<std::vector<float>>(sl.flat());
    const auto vocab = py::ssize_t(sl.logits[0].size());
    std::vector<py::ssize_t> shape = rows ? std::vector<py::ssize_t>{py::ssize_t(sl.logits.size()), vocab}
                                          : std::vector<py::ssize_t>{vocab};
    const float* data = flat->data();
    py::capsule owner(flat.release(), [](void* p) { delete static_cast<std::vector<float>*>(p); });
    return py::array_t<float>(shape, data, owner);
  }

  // The prompt positions each cache head of each layer holds after the method's prefill compression.
  py::list kept_positions(const std::string& prompt, const std::string& method, int budget, const py::object& params,
                          bool chat) {
    const auto ids = build_prompt(*file, *tok, prompt, chat);
    auto choice = choose_method(method, param_map(params), budget, engine->config(), "Model.kept_positions");
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

  py::dict generate(const std::string& prompt, const std::string& method, int budget, const py::object& params,
                    bool chat, int max_new_tokens, const std::vector<std::string>& stop) {
    const auto ids = build_prompt(*file, *tok, prompt, chat);
    GenerateOptions opt;
    opt.max_new_tokens = max_new_tokens;
    opt.stop = stop;
    auto [m, runner] = choose_method(method, param_map(params), budget, engine->config(), "Model.generate");
    Generation g;
    {
      py::gil_scoped_release release;
      g = kvb::generate(*engine, *tok, ids, opt, runner.get());
    }
    const size_t full = engine->full_kv_bytes(ids.size());
    const size_t kept = runner ? runner->prefill_kv_bytes() : full;
    py::dict d;
    d["text"] = utf8_lossy(g.text);
    d["ids"] = g.tokens;
    d["prompt_tokens"] = g.prompt_tokens;
    d["stop_reason"] = g.stop_reason;
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

// ---- Sweeps, results, metrics ----

py::dict run_spec(const std::string& path, const std::string& shard, bool progress) {
  const ExperimentSpec spec = load_experiment(path);
  Sweep sweep(spec, shard.empty() ? SweepShard{} : parse_shard(shard));
  SweepOutcome o;
  {
    py::gil_scoped_release release;
    o = sweep.run(progress);
  }
  py::dict d;
  d["out"] = spec.out;
  d["run"] = o.run;
  d["already"] = o.already;
  d["failed"] = o.failed;
  d["failures"] = o.failed ? py::object(py::str(o.failures)) : py::object(py::none());
  d["seconds"] = o.seconds;
  d["prefill_seconds"] = o.prefill_seconds;
  return d;
}

py::list read_records(const std::string& path) {
  if (!std::filesystem::exists(path)) fail("{}: no such results file", path);
  py::list out;
  for_each_record(path, [&](const json& r, int) { out.append(to_py(r)); });
  return out;
}

// The benchmark's own metric of each prediction, as a fraction (the caller averages and scales).
std::vector<double> score_each(const std::string& dataset, const std::vector<std::string>& predictions,
                               const std::vector<std::vector<std::string>>& answers,
                               const std::vector<std::vector<std::string>>& all_classes, const std::string& data_dir) {
  if (predictions.size() != answers.size())
    fail("score {}: {} predictions but {} answer lists", dataset, predictions.size(), answers.size());
  std::vector<double> s;
  const size_t slash = dataset.find('/');
  const std::string bench = dataset.substr(0, slash), name = slash == std::string::npos ? "" : dataset.substr(slash + 1);
  if (bench == "longbench" || bench == "longbench-e") {
    const std::string metric = longbench::metric_of(name);
    const longbench::Jieba* jieba =
        metric == "qa_f1_zh" || metric == "rouge_zh" ? &longbench::Jieba::load(data_dir) : nullptr;
    for (size_t i = 0; i < predictions.size(); ++i)
      s.push_back(longbench::score(name, predictions[i], answers[i], i < all_classes.size() ? all_classes[i]
                                                                                              : std::vector<std::string>{},
                                   jieba));
  } else if (bench == "ruler") {
    if (name.empty()) fail("score: name the RULER task, e.g. ruler/niah_single_1");
    for (size_t i = 0; i < predictions.size(); ++i)
      s.push_back(ruler_string_match(predictions[i], answers[i], ruler_scores_any(name)));
  } else if (dataset == "niah") {
    for (const auto& p : predictions) s.push_back(niah_score(p));
  } else {
    fail("score: unknown dataset '{}' (longbench/NAME, longbench-e/NAME, ruler/TASK or niah)", dataset);
  }
  return s;
}

}  // namespace
}  // namespace kvb::python

PYBIND11_MODULE(_kvbench, m) {
  using namespace kvb;
  using namespace kvb::python;
  m.doc() = "kvbench's native engine, registries, sweeps and metrics";
  const std::string pybind11_version =
      fmt::format("{}.{}.{}", PYBIND11_VERSION_MAJOR, PYBIND11_VERSION_MINOR, PYBIND11_VERSION_PATCH);
  m.attr("pybind11_version") = pybind11_version;
#if PYBIND11_VERSION_MAJOR < 2 || (PYBIND11_VERSION_MAJOR == 2 && PYBIND11_VERSION_MINOR < 12)
  // pybind11 before 2.12 reads numpy 1's descriptor layout: under numpy 2 every array it makes has
  // zero strides, each element reading as the first. Refuse rather than hand those out.
  {
    const std::string np = py::module_::import("numpy").attr("__version__").cast<std::string>();
    if (!np.starts_with("1."))
      throw py::import_error(fmt::format(
          "kvbench: this module was built with pybind11 {}, which predates numpy 2, and numpy {} is installed: its "
          "arrays would read wrong. Rebuild it with pybind11 >= 2.12 (scripts/setup.sh fetches 2.13.6; pip install . "
          "uses the package index's) or use numpy < 2",
          pybind11_version, np));
  }
#endif
  py::register_exception<Error>(m, "Error", PyExc_RuntimeError);

  py::class_<LayerView>(m, "LayerView", "One layer after the full-attention prefill, valid during compress()")
      .def_property_readonly("layer", [](const LayerView& l) { return l.get().layer; })
      .def_property_readonly("n_tokens", [](const LayerView& l) { return l.get().n_tokens; })
      .def_property_readonly("n_heads", [](const LayerView& l) { return l.get().n_heads; })
      .def_property_readonly("n_kv_heads", [](const LayerView& l) { return l.get().n_kv_heads; })
      .def_property_readonly("head_dim", [](const LayerView& l) { return l.get().head_dim; })
      .def_property_readonly("window", [](const LayerView& l) { return l.window; })
      .def_property_readonly("gqa", [](const LayerView& l) { return gqa_mode_name(l.gqa); })
      .def_property_readonly("stored_heads",
                             [](const LayerView& l) { return l.gqa == GqaMode::Repeat ? l.get().n_heads : l.get().n_kv_heads; })
      .def_property_readonly(
          "queries",
          [](py::object self) {
            const auto& l = self.cast<const LayerView&>();
            const auto& v = l.get();
            return view(l.queries(), {l.window, v.n_heads, v.head_dim}, self);
          },
          "post-RoPE queries of the last `window` tokens [window, n_heads, head_dim]")
      .def_property_readonly(
          "keys",
          [](py::object self) {
            const auto& v = self.cast<const LayerView&>().get();
            return view(v.k, {v.n_tokens, v.n_kv_heads, v.head_dim}, self);
          },
          "post-RoPE keys [n_tokens, n_kv_heads, head_dim]")
      .def_property_readonly(
          "values",
          [](py::object self) {
            const auto& v = self.cast<const LayerView&>().get();
            return view(v.v, {v.n_tokens, v.n_kv_heads, v.head_dim}, self);
          },
          "values [n_tokens, n_kv_heads, head_dim]")
      .def_property_readonly(
          "keys_pre_rope",
          [](py::object self) -> py::object {
            const auto& v = self.cast<const LayerView&>().get();
            if (!v.k_pre_rope) return py::none();
            return view(v.k_pre_rope, {v.n_tokens, v.n_kv_heads, v.head_dim}, self);
          },
          "keys before RoPE, when needs() asks for k_pre_rope, else None")
      .def_property_readonly(
          "attn_colsum",
          [](py::object self) -> py::object {
            const auto& v = self.cast<const LayerView&>().get();
            if (!v.attn_colsum) return py::none();
            return view(v.attn_colsum, {v.n_heads, v.n_tokens}, self);
          },
          "attention each key received summed over all queries [n_heads, n_tokens], when needs() asks, else None")
      .def("attention", &window_attention,
           "softmax attention rows of the window queries over all keys, causal [n_heads, window, n_tokens] (a new "
           "array)");

  m.def("register_method", &register_python_method, py::arg("cls"), py::arg("name"), py::arg("params"),
        py::arg("summary") = "");
  m.def("set_method_resolver", [](py::object resolver) {
    // Called with a name the registry does not know (python:module.Class); registers it or returns False.
    resolver.inc_ref();
    PyObject* raw = resolver.ptr();
    MethodRegistry::get().set_resolver([raw](const std::string& name) {
      py::gil_scoped_acquire gil;
      try {
        return py::reinterpret_borrow<py::object>(raw)(name).cast<bool>();
      } catch (py::error_already_set& e) {
        fail("method '{}': {}", name, e.what());
      }
    });
  });
  m.def("methods", [] {
    py::list l;
    const auto& reg = MethodRegistry::get();
    static const char* roles[] = {"standalone", "selector", "wrapper"};
    for (const auto& name : reg.names()) {
      const MethodInfo& info = reg.info(name);
      py::dict d;
      d["name"] = name;
      d["summary"] = info.summary;
      d["params"] = param_list(reg.param_specs(name));
      d["composition"] = roles[static_cast<int>(info.composition)];
      d["budgeted"] = info.budgeted;
      d["offline_step"] = bool(info.calibrate);
      l.append(d);
    }
    return l;
  });
  m.def("tasks", [] {
    py::list l;
    const auto& reg = TaskRegistry::get();
    for (const auto& name : reg.names()) {
      const TaskInfo& t = reg.info(name);
      py::dict d;
      d["name"] = name;
      d["summary"] = t.summary;
      d["options"] = param_list(t.options);
      l.append(d);
    }
    return l;
  });
  m.def("run", &run_spec, py::arg("spec_path"), py::arg("shard") = "", py::arg("progress") = true);
  m.def("read_records", &read_records, py::arg("path"));
  m.def("score_each", &score_each, py::arg("dataset"), py::arg("predictions"), py::arg("answers"),
        py::arg("all_classes"), py::arg("data_dir"));
  m.def("score_file", [](const std::string& dataset, const std::string& path, bool by_length, const std::string& data) {
    const std::string metric = longbench::metric_of(dataset);
    const longbench::Jieba* jieba = metric == "qa_f1_zh" || metric == "rouge_zh" ? &longbench::Jieba::load(data) : nullptr;
    const auto r = longbench::score_predictions(dataset, path, by_length, jieba);
    py::dict d;
    d["score"] = r.score;
    d["lines"] = r.lines;
    for (const auto& [range, s] : r.ranges) d[py::str(range)] = std::isnan(s) ? py::object(py::none()) : py::float_(s);
    return d;
  });
  m.def("score_interval", [](const std::vector<std::vector<double>>& strata, const std::string& average) {
    if (average != "samples" && average != "strata") fail("score_interval: average '{}' (samples or strata)", average);
    const MeanInterval ci = score_interval(strata, average == "samples" ? Average::Samples : Average::Strata);
    py::dict d;
    d["mean"] = ci.mean;
    d["n"] = ci.n;
    d["ci_low"] = ci.has_interval() ? py::object(py::float_(ci.low)) : py::object(py::none());
    d["ci_high"] = ci.has_interval() ? py::object(py::float_(ci.high)) : py::object(py::none());
    d["interval"] = ci.method;
    return d;
  }, py::arg("strata"), py::arg("average") = "samples");
  m.def("default_data_dir", &default_data_dir);
  m.def("code_version", &code_version);

  py::class_<Model>(m, "Model")
      .def(py::init<const std::string&, const std::string&, int, const std::string&, const std::string&>(),
           py::arg("path"), py::arg("backend") = "cpu", py::arg("threads") = 0, py::arg("kv_dtype") = "fp32",
           py::arg("weights") = "")
      .def("tokenize", &Model::tokenize, py::arg("text"), py::arg("chat") = false, py::arg("prompt") = false)
      .def("detokenize", [](const Model& md, const std::vector<int32_t>& ids, bool skip_special) {
             return utf8_lossy(md.tok->decode(ids, skip_special));
           }, py::arg("ids"), py::arg("skip_special") = false)
      .def("logits", &Model::logits, py::arg("ids"), py::arg("method") = "", py::arg("budget") = 0,
           py::arg("params") = py::none(), py::arg("steps") = 0, py::arg("continuation") = std::vector<int32_t>{})
      .def("kept_positions", &Model::kept_positions, py::arg("prompt"), py::arg("method"), py::arg("budget") = 0,
           py::arg("params") = py::none(), py::arg("chat") = true)
      .def("generate", &Model::generate, py::arg("prompt"), py::arg("method") = "", py::arg("budget") = 0,
           py::arg("params") = py::none(), py::arg("chat") = true, py::arg("max_new_tokens") = 128,
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
