#include "harness/report/table.hpp"

#include <fmt/format.h>

#include <fstream>

#include "harness/util/error.hpp"

namespace kvb {

std::string markdown_cell(const std::string& c) {
  std::string out;
  for (char ch : c)
    out += ch == '|'    ? std::string("\\|")
           : ch == '\n' ? std::string("<br>")
           : ch == '\r' ? std::string()
                        : std::string(1, ch);
  return out;
}

namespace {

std::string row_md(const std::vector<std::string>& cells) {
  std::string s = "|";
  for (const auto& c : cells) s += " " + markdown_cell(c) + " |";
  return s + "\n";
}

std::string tex(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '_':
      case '%':
      case '&':
      case '#':
      case '$':
      case '{':
      case '}':
        out += '\\';
        out += c;
        break;
      case '\\':
        out += "\\textbackslash{}";
        break;
      case '~':
        out += "\\textasciitilde{}";
        break;
      case '^':
        out += "\\textasciicircum{}";
        break;
      // In LaTeX's default (OT1) encoding these print as other glyphs: < as an inverted exclamation mark.
      case '<':
        out += "\\textless{}";
        break;
      case '>':
        out += "\\textgreater{}";
        break;
      case '|':
        out += "\\textbar{}";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string to_markdown(const Table& t) {
  std::string s = t.caption.empty() ? "" : "**" + t.caption + "**\n\n";
  const size_t n = t.columns.size();
  if (!t.groups.empty()) {
    // Markdown has one header row: the groups head the columns, the column names open the body.
    // Columns outside the groups (Avg.) keep their name in the header row.
    std::vector<std::string> head = {t.columns.front()};
    for (const auto& [label, span] : t.groups)
      for (int i = 0; i < span; ++i) head.push_back(i == 0 ? label : "");
    std::vector<std::string> names = t.columns;
    names[0] = "";
    for (size_t i = head.size(); i < n; ++i) {
      head.push_back(t.columns[i]);
      names[i] = "";
    }
    s += row_md(head);
    s += row_md(std::vector<std::string>(n, "---"));
    s += row_md(names);
  } else {
    s += row_md(t.columns);
    s += row_md(std::vector<std::string>(n, "---"));
  }
  for (const auto& b : t.blocks) {
    if (!b.heading.empty()) {
      std::vector<std::string> h(n);
      h[0] = "*" + b.heading + "*";
      s += row_md(h);
    }
    for (const auto& r : b.rows) s += row_md(r);
  }
  if (!t.note.empty()) s += "\n" + t.note + "\n";
  return s;
}

std::string to_csv(const Table& t) {
  const bool blocks = t.blocks.size() > 1 || (!t.blocks.empty() && !t.blocks.front().heading.empty());
  std::string s;
  std::vector<std::string> head;
  if (blocks) head.push_back("block");
  size_t col = 1;
  head.push_back(t.columns.front());
  for (const auto& [label, span] : t.groups)
    for (int i = 0; i < span && col < t.columns.size(); ++i) head.push_back(label + "/" + t.columns[col++]);
  for (; col < t.columns.size(); ++col) head.push_back(t.columns[col]);
  for (size_t i = 0; i < head.size(); ++i) s += (i ? "," : "") + csv_field(head[i]);
  s += "\n";
  for (const auto& b : t.blocks)
    for (const auto& r : b.rows) {
      std::string line = blocks ? csv_field(b.heading) + "," : "";
      for (size_t i = 0; i < r.size(); ++i) line += (i ? "," : "") + csv_field(r[i]);
      s += line + "\n";
    }
  return s;
}

std::string to_latex(const Table& t) {
  const size_t n = t.columns.size();
  std::string s = "\\begin{table}[t]\n\\centering\n\\small\n";
  if (!t.caption.empty()) s += "\\caption{" + tex(t.caption) + "}\n";
  s += "\\begin{tabular}{l" + std::string(n - 1, 'c') + "}\n\\toprule\n";
  if (!t.groups.empty()) {
    std::string rules;
    size_t at = 2;
    s += " ";
    for (const auto& [label, span] : t.groups) {
      s += fmt::format(" & \\multicolumn{{{}}}{{c}}{{{}}}", span, tex(label));
      rules += fmt::format("\\cmidrule(lr){{{}-{}}}", at, at + size_t(span) - 1);
      at += size_t(span);
    }
    for (; at <= n; ++at) s += " & ";
    s += " \\\\\n" + rules + "\n";
  }
  for (size_t i = 0; i < n; ++i) s += (i ? " & " : "") + tex(t.columns[i]);
  s += " \\\\\n\\midrule\n";
  for (size_t b = 0; b < t.blocks.size(); ++b) {
    if (b) s += "\\midrule\n";
    if (!t.blocks[b].heading.empty())
      s += fmt::format("\\multicolumn{{{}}}{{l}}{{\\textit{{{}}}}} \\\\\n", n, tex(t.blocks[b].heading));
    for (const auto& r : t.blocks[b].rows) {
      for (size_t i = 0; i < r.size(); ++i) s += (i ? " & " : "") + tex(r[i]);
      s += " \\\\\n";
    }
  }
  s += "\\bottomrule\n\\end{tabular}\n";
  if (!t.note.empty()) s += "\\\\[2pt]{\\footnotesize " + tex(t.note) + "}\n";
  return s + "\\end{table}\n";
}

void write_table(const Table& t, const std::string& stem, const std::set<std::string>& formats) {
  for (const auto& f : formats) {
    const std::string path = stem + "." + f;
    std::ofstream out(path);
    out << (f == "md" ? to_markdown(t) : f == "csv" ? to_csv(t) : to_latex(t));
    if (!out) fail("{}: cannot write", path);
  }
}

}  // namespace kvb
