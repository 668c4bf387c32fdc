// Methods for Python: the method registry, and methods written in Python (kvbench.Method), which see each
// layer as numpy arrays and join the native registry.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "harness/engine/engine.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/method/method.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "python/src/convert.hpp"

namespace kvb::python {
namespace {

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
        case ParamSpec::Type::Int:
          p[py::str(spec.name)] = params().get_int(spec.name);
          break;
        case ParamSpec::Type::Float:
          p[py::str(spec.name)] = params().get_float(spec.name);
          break;
        case ParamSpec::Type::Bool:
          p[py::str(spec.name)] = params().get_bool(spec.name);
          break;
        default:
          p[py::str(spec.name)] = text;
      }
    }
    inst_.attr("params") = p;
    const py::object n = call(
        "needs", [&] { return inst_.attr("needs")(); }, -1);
    if (!py::isinstance<py::dict>(n)) fail("python method {}: needs() must return a dict", name());
    for (const auto& [k, val] : n.cast<py::dict>()) {
      const std::string key = py::str(k).cast<std::string>();
      const std::string given = py::repr(val).cast<std::string>();
      // Python's bool is an int: a window of True is a mistake, and a flag of 1 is no flag. numpy's
      // integers and bools count as theirs.
      const bool is_bool =
          py::isinstance<py::bool_>(val) ||
          (py::hasattr(val, "dtype") && py::str(val.attr("dtype").attr("kind")).cast<std::string>() == "b");
      const bool is_int = !is_bool && PyIndex_Check(val.ptr());
      if (key == "window") {
        if (!is_int) fail("python method {}: needs() window must be an int, got {}", name(), given);
        const auto w = py::reinterpret_steal<py::int_>(PyNumber_Index(val.ptr()));
        // Above the prompt's length it is the whole prompt (C++ H2O asks for INT_MAX: every query).
        if (w < py::int_(0) || w > py::int_(std::numeric_limits<int>::max()))
          fail("python method {}: needs() window {} must be between 0 and {} tokens", name(), given,
               std::numeric_limits<int>::max());
        needs_.window = w.cast<int>();
      } else if (key == "attn_colsum" || key == "k_pre_rope") {
        if (!is_bool) fail("python method {}: needs() {} must be True or False, got {}", name(), key, given);
        (key == "attn_colsum" ? needs_.attn_colsum : needs_.k_pre_rope) = val.cast<bool>();
      } else {
        fail("python method {}: needs() returned unknown key '{}' (window, attn_colsum, k_pre_rope)", name(), key);
      }
    }
  }
  PrefillNeeds needs() const override { return needs_; }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    py::gil_scoped_acquire gil;
    const int S = v.n_tokens, T = b.tokens, heads = stored_heads();
    // Python owns the view object; once the call returns it refuses use instead of reading memory the
    // engine has moved on from.
    py::object handle = py::cast(LayerView{&v, gqa(), std::min(needs_.window, S)});
    py::object out = call(
        "compress", [&] { return inst_.attr("compress")(handle, T); }, v.layer);
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
      fail(
          "{}: compress returned {}; expected a numpy array (int positions [heads, k] or float scores [heads, S - "
          "window]) or a list of int arrays, one per stored head",
          where, py::str(py::type::of(out)).cast<std::string>());
    }
    const char kind = arr.dtype().kind();
    if (kind == 'i' || kind == 'u') {
      if (arr.ndim() != 2 || arr.shape(0) != heads)
        fail("{}: compress returned positions of shape {}; expected [{} stored heads, k]", where, shape_text(arr),
             heads);
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
    if (a && a.ndim() == 1 && a.size() == 0) return {};  // [] is a float array to numpy: keeping nothing
    const char kind = a ? a.dtype().kind() : '?';
    if (a && a.ndim() == 1 && kind == 'f')
      fail(
          "{}: head {}: positions must be integers, found floats; scores are one float array [heads, S - window], "
          "not a list",
          where, head);
    if (!a || a.ndim() != 1 || (kind != 'i' && kind != 'u'))
      fail("{}: head {}: positions must be a 1-D integer array", where, head);
    std::vector<int32_t> p;
    auto take = [&](auto x) {
      // Compared in the array's own type: an unsigned position past 2^63 is not a negative one.
      if (x < 0 || x >= decltype(x)(S)) fail("{}: head {}: position {} is out of range [0, {})", where, head, x, S);
      p.push_back(int32_t(x));
    };
    if (kind == 'u') {
      auto ints = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(a);
      for (py::ssize_t i = 0; i < ints.size(); ++i) take(ints.at(i));
    } else {
      auto ints = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(a);
      for (py::ssize_t i = 0; i < ints.size(); ++i) take(ints.at(i));
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
    if (py::isinstance<py::bool_>(v))
      specs.push_back(ParamSpec::boolean(key, v.cast<bool>(), ""));
    else if (py::isinstance<py::int_>(v)) {
      // The registry's integers span +-2^40 (exact in a double, as YAML and JSON read them).
      constexpr long kLimit = 1L << 40;
      const auto given = py::reinterpret_borrow<py::int_>(v);
      const bool within = given >= py::int_(-kLimit) && given <= py::int_(kLimit);
      if (!within)
        fail(
            "kvbench.register {}: parameter '{}' has the default {}, outside the integers a parameter holds (-2^40 to "
            "2^40)",
            name, key, py::repr(v).cast<std::string>());
      specs.push_back(ParamSpec::integer(key, v.cast<long>(), -kLimit, kLimit, ""));
    } else if (py::isinstance<py::float_>(v))
      specs.push_back(ParamSpec::real(key, v.cast<double>(), -1e300, 1e300, ""));
    else if (py::isinstance<py::str>(v))
      specs.push_back(ParamSpec::text(key, v.cast<std::string>(), ""));
    else
      fail("kvbench.register {}: parameter '{}' has a default of type {}; expected int, float, bool or str", name, key,
           py::str(py::type::of(v)).cast<std::string>());
  }
  // The class lives as long as the process: the registry outlives the interpreter's own teardown.
  cls.inc_ref();
  PyObject* raw = cls.ptr();
  MethodInfo info{
      name, summary.empty() ? "written in Python" : summary, specs, [raw, name] {
        py::gil_scoped_acquire gil;
        try {
          return std::unique_ptr<Method>(std::make_unique<PyMethod>(py::reinterpret_borrow<py::object>(raw)()));
        } catch (py::error_already_set& e) {
          fail("python method {}: constructing it raised {}", name, e.what());
        }
      }};
  // Registering a Python method again (its class edited in a notebook) replaces it; a C++ method's name
  // stays taken.
  static std::set<std::string> from_python;
  if (from_python.count(name)) {
    MethodRegistry::get().replace(std::move(info));
  } else {
    MethodRegistry::get().add(std::move(info));
    from_python.insert(name);
  }
}

}  // namespace

void bind_methods(py::module_& m) {
  py::class_<LayerView>(m, "LayerView", "One layer after the full-attention prefill, valid during compress()")
      .def_property_readonly("layer", [](const LayerView& l) { return l.get().layer; })
      .def_property_readonly("n_tokens", [](const LayerView& l) { return l.get().n_tokens; })
      .def_property_readonly("n_heads", [](const LayerView& l) { return l.get().n_heads; })
      .def_property_readonly("n_kv_heads", [](const LayerView& l) { return l.get().n_kv_heads; })
      .def_property_readonly("head_dim", [](const LayerView& l) { return l.get().head_dim; })
      .def_property_readonly("window", [](const LayerView& l) { return l.window; })
      .def_property_readonly("gqa", [](const LayerView& l) { return gqa_mode_name(l.gqa); })
      .def_property_readonly(
          "stored_heads",
          [](const LayerView& l) { return l.gqa == GqaMode::Repeat ? l.get().n_heads : l.get().n_kv_heads; })
      .def_property_readonly(
          "queries",
          [](const LayerView& l) {
            const auto& v = l.get();
            return copied(l.queries(), {l.window, v.n_heads, v.head_dim});
          },
          "post-RoPE queries of the last `window` tokens [window, n_heads, head_dim]")
      .def_property_readonly(
          "keys",
          [](const LayerView& l) {
            const auto& v = l.get();
            return copied(v.k, {v.n_tokens, v.n_kv_heads, v.head_dim});
          },
          "post-RoPE keys [n_tokens, n_kv_heads, head_dim]")
      .def_property_readonly(
          "values",
          [](const LayerView& l) {
            const auto& v = l.get();
            return copied(v.v, {v.n_tokens, v.n_kv_heads, v.head_dim});
          },
          "values [n_tokens, n_kv_heads, head_dim]")
      .def_property_readonly(
          "keys_pre_rope",
          [](const LayerView& l) -> py::object {
            const auto& v = l.get();
            if (!v.k_pre_rope) return py::none();
            return copied(v.k_pre_rope, {v.n_tokens, v.n_kv_heads, v.head_dim});
          },
          "keys before RoPE, when needs() asks for k_pre_rope, else None")
      .def_property_readonly(
          "attn_colsum",
          [](const LayerView& l) -> py::object {
            const auto& v = l.get();
            if (!v.attn_colsum) return py::none();
            return copied(v.attn_colsum, {v.n_heads, v.n_tokens});
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
      d["offline_step"] = !info.steps.empty();
      l.append(d);
    }
    return l;
  });
}

}  // namespace kvb::python
