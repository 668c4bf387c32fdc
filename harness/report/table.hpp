#pragma once
// Result tables in the papers' layouts, rendered as Markdown, CSV and LaTeX (booktabs) from one
// description: an optional row of column groups (LongBench's categories) over the column names, and
// rows gathered in blocks (one per KV size) under a heading row.
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace kvb {

struct Table {
  std::string caption;
  std::vector<std::pair<std::string, int>> groups;  // (label, columns spanned) over the columns after the first
  std::vector<std::string> columns;
  struct Block {
    std::string heading;  // e.g. "KV size = 128"; empty for a table without blocks
    std::vector<std::vector<std::string>> rows;
  };
  std::vector<Block> blocks;
  std::string note;
};

std::string to_markdown(const Table& t);
std::string to_csv(const Table& t);
std::string to_latex(const Table& t);

// A Markdown table cell's text: a '|' would end the cell and a line break the row.
std::string markdown_cell(const std::string& c);
// A CSV field, quoted where it must be.
std::string csv_field(const std::string& s);

// Writes <stem>.md / .csv / .tex for the formats asked for ("md", "csv", "tex").
void write_table(const Table& t, const std::string& stem, const std::set<std::string>& formats);

}  // namespace kvb
