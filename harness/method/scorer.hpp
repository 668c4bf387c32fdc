#pragma once
// The base of a method that scores the prompt's tokens and keeps the best of each head (kvpress's
// ScorerPress): a method writes score(), and caps() where heads or layers get budgets of their own.
// It is a Selector: wrappers (KVCrush, VECTOR) can take its decision and change it.
#include <optional>
#include <vector>

#include "harness/method/method.hpp"

namespace kvb {

class ScorerMethod : public Method {
 public:
  // The observation-window queries the scores read: window() of them.
  PrefillNeeds needs() const override { return {.window = window()}; }
  // A KV size below window(): the window alone would not fit (at T = window(), it is all a head keeps).
  void check_budget(int tokens) const override;
  // The top caps() prefix tokens of each stored head by score() (averaged over a KV head's query
  // heads in native GQA mode), plus the last window() tokens.
  std::optional<Selection> select(const PrefillView& view, const Budget& budget) override;

 protected:
  // Per query head, a score for each prefix position [0, S - window()); higher is kept first.
  virtual HeadScores score(const PrefillView& view) = 0;
  // Prefix (non-window) slots of each stored head: T - window() for every head unless overridden.
  virtual std::vector<int> caps(const PrefillView& view, const Budget& budget);
  // The last tokens of the prompt every head keeps: the parameter `window`.
  virtual int window() const { return params().integer("window"); }
};

}  // namespace kvb
