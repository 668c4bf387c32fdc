// Sweeps, results files, the task registry and the benchmarks' metrics for Python.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/report/records.hpp"
#include "harness/report/stats.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "python/src/convert.hpp"

namespace kvb::python {
namespace {

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
  d["prompt_tokens"] = o.prompt_tokens;
  d["prefilled_tokens"] = o.prefilled_tokens;
  return d;
}

// As kvbench report reads them: a cell or a pooled sample recorded twice once, copies that disagree an error.
py::list read_records(const std::vector<std::string>& paths) {
  for (const auto& path : paths)
    if (!std::filesystem::exists(path)) fail("{}: no such results file", path);
  py::list out;
  report::for_each_distinct_record(paths, [&](const json& r, const std::string&, int) { out.append(to_py(r)); });
  return out;
}

// The benchmark's own metric of each prediction, as a fraction (the caller averages and scales).
std::vector<double> score_each(const std::string& dataset, const std::vector<std::string>& predictions,
                               const std::vector<std::vector<std::string>>& answers,
                               const std::vector<std::vector<std::string>>& all_classes, const std::string& data_dir) {
  if (predictions.size() != answers.size())
    fail("score {}: {} predictions but {} answer lists", dataset, predictions.size(), answers.size());
  std::vector<double> s;
  for (size_t i = 0; i < predictions.size(); ++i)
    s.push_back(
        score_prediction(dataset, {.prediction = predictions[i],
                                   .answers = answers[i],
                                   .all_classes = i < all_classes.size() ? all_classes[i] : std::vector<std::string>{},
                                   .data_dir = data_dir}));
  return s;
}

}  // namespace

void bind_results(py::module_& m) {
  m.def("tasks", [] {
    py::list l;
    const auto& reg = TaskRegistry::get();
    for (const auto& name : reg.names()) {
      const TaskInfo& t = reg.info(name);
      py::dict d;
      d["name"] = name;
      d["summary"] = t.summary;
      d["options"] = param_list(t.options);
      d["perplexity"] = t.layout.perplexity;  // scores are NLLs, reported as exp of their mean
      l.append(d);
    }
    return l;
  });
  m.def("run", &run_spec, py::arg("spec_path"), py::arg("shard") = "", py::arg("progress") = true);
  m.def("read_records", &read_records, py::arg("paths"));
  m.def("score_each", &score_each, py::arg("dataset"), py::arg("predictions"), py::arg("answers"),
        py::arg("all_classes"), py::arg("data_dir"));
  m.def("score_file", [](const std::string& dataset, const std::string& path, bool by_length, const std::string& data) {
    const auto r = score_predictions_file(dataset, path, by_length, data);
    py::dict d;
    d["score"] = r.score;
    d["lines"] = r.lines;
    for (const auto& [range, s] : r.ranges) d[py::str(range)] = std::isnan(s) ? py::object(py::none()) : py::float_(s);
    return d;
  });
  m.def(
      "score_interval",
      [](const std::vector<std::vector<double>>& strata, const std::string& average) {
        if (average != "samples" && average != "strata")
          fail("score_interval: average '{}' (samples or strata)", average);
        for (const auto& s : strata)
          for (double v : s)
            if (!std::isfinite(v)) fail("score_interval: score {} is not a finite number", v);
        const MeanInterval ci = score_interval(strata, average == "samples" ? Average::Samples : Average::Strata);
        py::dict d;
        d["mean"] = ci.mean;
        d["n"] = ci.n;
        d["ci_low"] = ci.has_interval() ? py::object(py::float_(ci.low)) : py::object(py::none());
        d["ci_high"] = ci.has_interval() ? py::object(py::float_(ci.high)) : py::object(py::none());
        d["interval"] = ci.method;
        return d;
      },
      py::arg("strata"), py::arg("average") = "samples");
  m.def("default_data_dir", &default_data_dir);
  m.def("code_version", &code_version);
}

}  // namespace kvb::python
