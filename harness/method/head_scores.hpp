#pragma once
// Head-importance scores (HeadKV, methods/headkv/README.md §1, §5-§8), shared by every method that budgets heads
// by them (HeadKV, MixedDimKV-H). The file layout is the HeadKV repository's, {"l-h": [score of each
// successful profiling test]}, plus a "header" object in the files kvbench writes; the repository's own
// score files load too (checked by shape, since they carry no model fingerprint).
#include <string>
#include <vector>

#include "harness/method/method.hpp"
#include "harness/model/config.hpp"
#include "harness/util/params.hpp"

namespace kvb {

// Which profiling the scores come from: retrieval-reasoning (HeadKV-R2) or retrieval (HeadKV-R).
enum class HeadScoreKind { RetrievalReasoning, Retrieval };
HeadScoreKind parse_head_score_kind(const std::string& s);  // "r2" or "r"
std::string artifact_kind(HeadScoreKind k);                 // "headkv_r2", "headkv_r"

struct HeadImportance {
  std::vector<std::vector<double>> score;  // [layer][query head]: mean over the successful tests
  std::string source;                      // the file, or "uniform"
  std::string digest;                      // fnv1a-64 of the file's text (results are keyed by it)
};

// Loads the scores at `path` ("" = this model's artifact, "uniform" = every head alike, which reduces
// HeadKV to SnapKV with mean reduction). Errors name the file and the problem: a missing "l-h" key,
// a key beyond the model's layers or heads, an empty list, or a value that is not a finite number >= 0.
HeadImportance load_head_importance(HeadScoreKind kind, const std::string& path, const ModelConfig& model);

// Scores per stored head: query heads as they are (repeat), or summed over each KV head's group
// (native; methods/headkv/README.md §2: the group mean of the query heads' capacities).
std::vector<std::vector<double>> head_scores_for_gqa(const HeadImportance& imp, int n_kv_heads, GqaMode mode);

// The parameters of HeadKV's head budgets, shared by the methods that use them: heads, scores, beta,
// temp, caps.
std::vector<ParamSpec> head_budget_params();
// Loads the scores the parameters name (Method::setup of those methods).
HeadImportance load_head_importance(const Params& p, const ModelConfig& model);
// Non-window capacities [layer][stored head] for KV size T and window w under those parameters.
std::vector<std::vector<int>> head_capacities(const HeadImportance& imp, const Params& p, int n_kv_heads, GqaMode mode,
                                              int T, int w);

}  // namespace kvb
