// docs/architecture.md stays true to the tree. The page is read as a reader reads it, and every
// name in it is looked up in the repository:
//
//   - every path written in backticks (`comm/work.h`, `comm/host_backend.*`, `nn/ddp/`) exists;
//   - every table with a "file" and a "function" column (the trip, the setup, the algorithms):
//     each function of a row is defined in that row's .cpp (`name(...) {`, merely calling it does
//     not count) or declared in that row's header, and each of its qualifiers (`Reducer` of
//     `Reducer::finalize`) is a word of that file;
//   - every other backticked C++ name (`GradBucket`, `ReduceOp::avg`, `finalize()`) is a word of a
//     source file the page names, outside test/ (`name(` when written with parentheses);
//   - the rooms map: every file and folder it lists exists, and a folder that lists its files
//     lists all of them (and all its sub-folders), so a new file cannot be left off the map;
//   - the arrows are the link lines of CMakeLists.txt, no more and no fewer;
//   - "runs through N files" is the number of distinct files in the trip's tables;
//   - every relative link leads to a file that exists.
// Comments are not code: a name found only in a comment of a file does not count as being there.
// The checker returns its findings as text, and a test feeds it pages with known mistakes, so the
// checks are known to fail when the page is wrong.
#include <doctest/doctest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace fs = std::filesystem;

namespace {

fs::path repository_root() { return fs::path(TINYDDP_SOURCE_DIR); }

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// ---- the page, as blocks, tables and prose ----------------------------------------------------

struct Table {
  std::string section;  // the "## " heading above it
  int line = 0;         // of its header row
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

struct CodeBlock {
  std::string section;
  std::vector<std::string> lines;
};

struct Page {
  std::vector<std::pair<int, std::string>> prose;  // line number, text: everything outside code blocks
  std::vector<CodeBlock> blocks;
  std::vector<Table> tables;
  std::map<std::string, std::string> section_text;  // heading -> its prose
};

std::vector<std::string> table_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::string inner = trim(line);
  if (!inner.empty() && inner.front() == '|') inner.erase(0, 1);
  if (!inner.empty() && inner.back() == '|') inner.pop_back();
  std::stringstream in(inner);
  std::string cell;
  while (std::getline(in, cell, '|')) cells.push_back(trim(cell));
  return cells;
}

Page parse_page(const std::string& markdown) {
  Page page;
  std::istringstream in(markdown);
  std::string line, section;
  int number = 0;
  bool in_block = false;
  Table* table = nullptr;
  while (std::getline(in, line)) {
    ++number;
    if (line.rfind("```", 0) == 0) {
      in_block = !in_block;
      if (in_block) page.blocks.push_back({section, {}});
      table = nullptr;
      continue;
    }
    if (in_block) {
      page.blocks.back().lines.push_back(line);
      continue;
    }
    if (line.rfind("## ", 0) == 0) section = line.substr(3);
    page.prose.emplace_back(number, line);
    page.section_text[section] += line + "\n";
    if (line.rfind("|", 0) != 0) {
      table = nullptr;
      continue;
    }
    if (table == nullptr) {
      page.tables.push_back({section, number, table_cells(line), {}});
      table = &page.tables.back();
    } else if (line.find("---") == std::string::npos) {
      table->rows.push_back(table_cells(line));
    }
  }
  return page;
}

std::vector<std::string> backticked(const std::string& text) {
  static const std::regex code("`([^`]+)`");
  std::vector<std::string> tokens;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), code); it != std::sregex_iterator(); ++it)
    tokens.push_back((*it)[1].str());
  return tokens;
}

// ---- what a token is ----------------------------------------------------------------------------

bool is_path(const std::string& token) {
  static const std::regex path(R"re([A-Za-z0-9_.\-]+(/[A-Za-z0-9_.*\-]+)*/?)re");
  static const std::regex extension(R"re(.*\.(h|cpp|cu|cuh|md|txt|sh|py|cmake|\*)$)re");
  return std::regex_match(token, path) && (token.find('/') != std::string::npos || std::regex_match(token, extension));
}

// A C++ name, maybe qualified, maybe written as a call: `finalize`, `Reducer::finalize`, `finalize()`.
struct CppName {
  std::vector<std::string> qualifiers;
  std::string name;
  bool call = false;
};

bool parse_cpp_name(const std::string& token, CppName& out) {
  static const std::regex name(R"re([A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*(\(\))?)re");
  if (!std::regex_match(token, name)) return false;
  std::string text = token;
  out = {};
  if (text.size() > 2 && text.compare(text.size() - 2, 2, "()") == 0) {
    out.call = true;
    text.resize(text.size() - 2);
  }
  size_t start = 0;
  for (size_t at; (at = text.find("::", start)) != std::string::npos; start = at + 2)
    out.qualifiers.push_back(text.substr(start, at - start));
  out.name = text.substr(start);
  return true;
}

// The files a path names: itself, or for `dir/stem.*` every file of that stem. Empty: none exist.
std::vector<fs::path> resolve(const fs::path& root, const std::string& token) {
  if (token.back() == '/') {
    if (fs::is_directory(root / token)) return {root / token};
    return {};
  }
  const fs::path path = root / token;
  const std::string leaf = path.filename().string();
  if (leaf.size() > 2 && leaf.compare(leaf.size() - 2, 2, ".*") == 0) {
    std::vector<fs::path> found;
    const std::string stem = leaf.substr(0, leaf.size() - 1);  // "name."
    if (fs::is_directory(path.parent_path()))
      for (const auto& entry : fs::directory_iterator(path.parent_path()))
        if (entry.is_regular_file() && entry.path().filename().string().rfind(stem, 0) == 0)
          found.push_back(entry.path());
    std::sort(found.begin(), found.end());
    return found;
  }
  return fs::exists(path) ? std::vector<fs::path>{path} : std::vector<fs::path>{};
}

bool is_source(const fs::path& path) {
  const std::string ext = path.extension().string();
  return ext == ".h" || ext == ".cpp" || ext == ".cu" || ext == ".cuh";
}

// ---- looking names up in source -----------------------------------------------------------------

bool is_word_char(char c) { return std::isalnum((unsigned char)c) || c == '_'; }

// The source without its comments (strings and character literals are kept as they are).
std::string without_comments(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size();) {
    if (src.compare(i, 2, "//") == 0) {
      while (i < src.size() && src[i] != '\n') ++i;
    } else if (src.compare(i, 2, "/*") == 0) {
      size_t end = src.find("*/", i + 2);
      i = end == std::string::npos ? src.size() : end + 2;
      out += ' ';
    } else if (src.compare(i, 2, "R\"") == 0 && (i == 0 || !is_word_char(src[i - 1]))) {
      const size_t open = src.find('(', i + 2);
      if (open == std::string::npos) {
        out += src.substr(i);
        break;
      }
      std::string close(1, ')');  // )delimiter"
      close.append(src, i + 2, open - i - 2).push_back('"');
      size_t end = src.find(close, open);
      end = end == std::string::npos ? src.size() : end + close.size();
      out += src.substr(i, end - i);
      i = end;
    } else if (src[i] == '"' || (src[i] == '\'' && !(i > 0 && std::isxdigit((unsigned char)src[i - 1])))) {
      // A literal, copied whole (a digit separator such as 1'000 is no quote).
      const char quote = src[i];
      size_t j = i + 1;
      while (j < src.size() && src[j] != quote && src[j] != '\n') j += src[j] == '\\' ? 2 : 1;
      j = std::min(src.size(), j + 1);
      out += src.substr(i, j - i);
      i = j;
    } else {
      out += src[i++];
    }
  }
  return out;
}

// Whether `word` occurs as a whole word; with `call`, followed by "(" (spaces allowed between).
bool has_word(const std::string& code, const std::string& word, bool call) {
  for (size_t at = code.find(word); at != std::string::npos; at = code.find(word, at + 1)) {
    if (at > 0 && is_word_char(code[at - 1])) continue;
    size_t end = at + word.size();
    if (end < code.size() && is_word_char(code[end])) continue;
    if (!call) return true;
    while (end < code.size() && std::isspace((unsigned char)code[end])) ++end;
    if (end < code.size() && code[end] == '(') return true;
  }
  return false;
}

class SourceCache {
 public:
  const std::string& code(const fs::path& path) {
    auto it = code_.find(path.string());
    if (it == code_.end()) it = code_.emplace(path.string(), without_comments(read_text(path))).first;
    return it->second;
  }

 private:
  std::map<std::string, std::string> code_;
};

// Every qualifier a word of the file, and the name itself (a call or definition when `call`).
bool file_has(SourceCache& sources, const fs::path& file, const CppName& name, bool call) {
  const std::string& code = sources.code(file);
  for (const std::string& q : name.qualifiers)
    if (!has_word(code, q, false)) return false;
  return has_word(code, name.name, call);
}

// Whether `code` defines the function: `name(...)`, then maybe const / override / noexcept / final,
// then its body `{` (or, for a constructor, its initializer list `:`). A call is followed by
// something else (`;`, `,`, `)`, an operator).
bool defines(const std::string& code, const CppName& name) {
  const bool constructor = !name.qualifiers.empty() && name.qualifiers.back() == name.name;
  const std::string& word = name.name;
  for (size_t at = code.find(word); at != std::string::npos; at = code.find(word, at + 1)) {
    const size_t after = at + word.size();
    if ((at > 0 && is_word_char(code[at - 1])) || (after < code.size() && is_word_char(code[after]))) continue;
    size_t k = after;
    while (k < code.size() && std::isspace((unsigned char)code[k])) ++k;
    if (k >= code.size() || code[k] != '(') continue;
    int depth = 0;
    for (; k < code.size(); ++k) {
      if (code[k] == '(') ++depth;
      if (code[k] == ')' && --depth == 0) break;
    }
    if (k >= code.size()) continue;
    ++k;
    for (;;) {
      while (k < code.size() && std::isspace((unsigned char)code[k])) ++k;
      size_t end = k;
      while (end < code.size() && is_word_char(code[end])) ++end;
      const std::string specifier = code.substr(k, end - k);
      if (specifier == "const" || specifier == "override" || specifier == "final" || specifier == "noexcept" ||
          specifier == "mutable") {
        k = end;
        continue;
      }
      break;
    }
    if (k < code.size() && code[k] == '{') return true;
    if (constructor && k + 1 < code.size() && code[k] == ':' && code[k + 1] != ':') return true;
  }
  return false;
}

// A row's function: defined in a .cpp (a call there does not count); declared or defined in a header.
bool file_has_function(SourceCache& sources, const fs::path& file, const CppName& name) {
  if (!file_has(sources, file, name, true)) return false;
  return file.extension() != ".cpp" || defines(sources.code(file), name);
}

// ---- the checks ---------------------------------------------------------------------------------

using Problems = std::vector<std::string>;

// The rooms map: `folder/` and `file` entries, indented two spaces per level under their folder;
// lines indented further continue the description above.
struct RoomsMap {
  std::map<std::string, std::vector<std::string>> children;  // folder ("" = root) -> entries as written
  std::vector<std::string> entries;                          // every entry, as a path from the root
};

constexpr size_t kMapEntryIndent = 12;  // description lines start further in

RoomsMap parse_rooms(const CodeBlock& block, Problems& problems) {
  static const std::regex entry(R"re([A-Za-z0-9_.\-]+(/|\.\*|\.[A-Za-z]+))re");
  RoomsMap map;
  std::vector<std::string> stack;  // the folder at each depth
  for (const std::string& line : block.lines) {
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || indent >= kMapEntryIndent) continue;
    const std::string token = line.substr(indent, line.find(' ', indent) - indent);
    const size_t depth = indent / 2;
    if (indent % 2 != 0 || depth > stack.size() || !std::regex_match(token, entry)) {
      problems.push_back("the rooms map cannot be read at \"" + line +
                         "\": an entry is a file or a folder/, "
                         "indented two spaces per level under its folder");
      continue;
    }
    stack.resize(depth);
    const std::string parent = depth == 0 ? "" : stack.back();
    map.children[parent].push_back(token);
    map.entries.push_back(parent + token);
    if (token.back() == '/') stack.push_back(parent + token);
  }
  return map;
}

Problems check_rooms(const RoomsMap& map, const fs::path& root) {
  Problems problems;
  for (const std::string& entry : map.entries)
    if (resolve(root, entry).empty()) problems.push_back("the rooms map lists " + entry + ", which does not exist");
  for (const auto& [folder, listed] : map.children) {
    if (folder.empty() || !fs::is_directory(root / folder)) continue;  // the root holds build output too
    const bool lists_files = std::any_of(listed.begin(), listed.end(),
                                         [](const std::string& e) { return e.back() != '/'; });
    for (const auto& item : fs::directory_iterator(root / folder)) {
      const std::string name = item.path().filename().string();
      if (item.is_directory()) {
        if (std::find(listed.begin(), listed.end(), name + "/") == listed.end())
          problems.push_back("the rooms map lists the rooms of " + folder + " but not " + folder + name + "/");
      } else if (lists_files && is_source(item.path())) {
        const std::string glob = item.path().stem().string() + ".*";
        if (std::find(listed.begin(), listed.end(), name) == listed.end() &&
            std::find(listed.begin(), listed.end(), glob) == listed.end())
          problems.push_back("the rooms map lists the files of " + folder + " but not " + folder + name);
      }
    }
  }
  return problems;
}

// Every file the page names: backticked paths, the rooms map's entries, expanded.
std::set<fs::path> named_files(const Page& page, const RoomsMap& map, const fs::path& root) {
  std::set<fs::path> files;
  auto add = [&](const std::string& token) {
    for (const fs::path& p : resolve(root, token))
      if (fs::is_regular_file(p)) files.insert(p);
  };
  for (const auto& [number, line] : page.prose)
    for (const std::string& token : backticked(line))
      if (is_path(token)) add(token);
  for (const std::string& entry : map.entries) add(entry);
  return files;
}

Problems check_paths(const Page& page, const fs::path& root) {
  Problems problems;
  for (const auto& [number, line] : page.prose)
    for (const std::string& token : backticked(line))
      if (is_path(token) && resolve(root, token).empty())
        problems.push_back("line " + std::to_string(number) + " names `" + token + "`, which does not exist");
  return problems;
}

int column(const Table& table, const std::string& name) {
  for (size_t i = 0; i < table.header.size(); ++i)
    if (table.header[i] == name) return int(i);
  return -1;
}

// Rows of the tables that name a file and its functions; `checked` counts the functions looked up.
Problems check_function_tables(const Page& page, const fs::path& root, SourceCache& sources, int* checked) {
  Problems problems;
  for (const Table& table : page.tables) {
    const int file_col = column(table, "file"), function_col = column(table, "function");
    if (file_col < 0 || function_col < 0) continue;
    for (size_t r = 0; r < table.rows.size(); ++r) {
      const std::vector<std::string>& row = table.rows[r];
      const std::string where = "the table at line " + std::to_string(table.line) + ", row " + std::to_string(r + 1);
      if (int(row.size()) <= std::max(file_col, function_col)) {
        problems.push_back(where + " has too few cells");
        continue;
      }
      const std::vector<std::string> files = backticked(row[size_t(file_col)]);
      if (files.size() != 1 || !is_path(files[0])) {
        problems.push_back(where + ": the file cell must name one file in backticks");
        continue;
      }
      const std::vector<fs::path> resolved = resolve(root, files[0]);
      if (resolved.size() != 1 || !fs::is_regular_file(resolved[0])) {
        problems.push_back(where + ": `" + files[0] + "` is not a file");
        continue;
      }
      const std::vector<std::string> functions = backticked(row[size_t(function_col)]);
      if (functions.empty()) problems.push_back(where + ": the function cell names no function in backticks");
      for (const std::string& token : functions) {
        CppName name;
        if (!parse_cpp_name(token, name)) {
          problems.push_back(where + ": `" + token + "` is not a C++ name");
          continue;
        }
        if (checked) ++*checked;
        if (!file_has_function(sources, resolved[0], name))
          problems.push_back(where + ": " + files[0] +
                             (resolved[0].extension() == ".cpp" ? " does not define `" : " does not declare `") +
                             token + "`");
      }
    }
  }
  return problems;
}

// Every other backticked C++ name: a word of some library or example file the page names (not of
// a test: this one spells wrong names on purpose).
Problems check_names(const Page& page, const std::set<fs::path>& files, const fs::path& root, SourceCache& sources) {
  Problems problems;
  for (const auto& [number, line] : page.prose)
    for (const std::string& token : backticked(line)) {
      CppName name;
      if (is_path(token) || !parse_cpp_name(token, name)) continue;
      if (name.qualifiers.empty() && !name.call && fs::is_directory(root / token)) continue;  // a library: `core`
      const bool found = std::any_of(files.begin(), files.end(), [&](const fs::path& file) {
        const bool test = file.lexically_relative(root).begin()->string() == "test";
        return is_source(file) && !test && file_has(sources, file, name, name.call);
      });
      if (!found)
        problems.push_back("line " + std::to_string(number) + " names `" + token +
                           "`, which no file named on the page " + (name.call ? "calls or defines" : "contains"));
    }
  return problems;
}

// The arrows block ("core <- kernels <- nn": kernels uses core, nn uses kernels) against the
// target_link_libraries lines of the libraries in CMakeLists.txt.
Problems check_arrows(const CodeBlock& block, const std::string& cmake) {
  Problems problems;
  std::set<std::pair<std::string, std::string>> drawn, linked;  // (user, used)
  for (const std::string& line : block.lines) {
    std::vector<std::string> names;
    size_t start = 0;
    for (size_t at; (at = line.find("<-", start)) != std::string::npos; start = at + 2)
      names.push_back(trim(line.substr(start, at - start)));
    names.push_back(trim(line.substr(start)));
    for (size_t i = 0; i + 1 < names.size(); ++i) drawn.insert({names[i + 1], names[i]});
  }
  static const std::regex link(R"re(target_link_libraries\(tinyddp_(\w+)\s([^)]*)\))re");
  static const std::regex library(R"re(\btinyddp_(\w+))re");
  for (auto it = std::sregex_iterator(cmake.begin(), cmake.end(), link); it != std::sregex_iterator(); ++it) {
    const std::string user = (*it)[1].str(), args = (*it)[2].str();
    for (auto lib = std::sregex_iterator(args.begin(), args.end(), library); lib != std::sregex_iterator(); ++lib)
      linked.insert({user, (*lib)[1].str()});
  }
  if (drawn.empty()) problems.push_back("the arrows block draws no arrow");
  for (const auto& [user, used] : drawn)
    if (!linked.count({user, used}))
      problems.push_back("an arrow says " + user + " uses " + used + "; CMakeLists.txt does not link it");
  for (const auto& [user, used] : linked)
    if (!drawn.count({user, used}))
      problems.push_back("CMakeLists.txt links tinyddp_" + user + " to tinyddp_" + used + "; no arrow says so");
  return problems;
}

const std::string kTripSection = "One gradient's trip";

// "runs through N files" against the distinct files of the trip's tables.
Problems check_trip_count(const Page& page, int* rows) {
  Problems problems;
  std::set<std::string> files;
  std::string text;
  for (const auto& [section, prose] : page.section_text)
    if (section.rfind(kTripSection, 0) == 0) text = prose;
  for (const Table& table : page.tables) {
    const int file_col = column(table, "file");
    if (table.section.rfind(kTripSection, 0) != 0 || file_col < 0) continue;
    for (const auto& row : table.rows) {
      if (rows) ++*rows;
      if (int(row.size()) > file_col)
        for (const std::string& token : backticked(row[size_t(file_col)])) files.insert(token);
    }
  }
  static const std::regex count(R"re(runs through (\d+) files)re");
  std::smatch m;
  if (!std::regex_search(text, m, count)) {
    problems.push_back("the trip does not say how many files it runs through (\"runs through N files\")");
  } else if (std::stoul(m[1].str()) != files.size()) {
    problems.push_back("the trip says it runs through " + m[1].str() + " files; its tables name " +
                       std::to_string(files.size()));
  }
  return problems;
}

Problems check_links(const std::string& markdown, const fs::path& page_dir) {
  Problems problems;
  static const std::regex link(R"re(\]\(([^)#\s]+)(#[^)]*)?\))re");
  for (auto it = std::sregex_iterator(markdown.begin(), markdown.end(), link); it != std::sregex_iterator(); ++it) {
    const std::string target = (*it)[1].str();
    if (target.find("://") == std::string::npos && !fs::exists(page_dir / target))
      problems.push_back("the page links to " + target + ", which does not exist");
  }
  return problems;
}

const CodeBlock* block_in(const Page& page, const std::string& section) {
  for (const CodeBlock& block : page.blocks)
    if (block.section.rfind(section, 0) == 0) return &block;
  return nullptr;
}

// Everything above, for one page.
Problems check_page(const std::string& markdown, const fs::path& root) {
  Problems problems;
  const Page page = parse_page(markdown);
  auto append = [&](Problems more) { problems.insert(problems.end(), more.begin(), more.end()); };
  SourceCache sources;
  RoomsMap map;
  if (const CodeBlock* rooms = block_in(page, "The rooms")) {
    map = parse_rooms(*rooms, problems);
    append(check_rooms(map, root));
  }
  append(check_paths(page, root));
  append(check_function_tables(page, root, sources, nullptr));
  append(check_names(page, named_files(page, map, root), root, sources));
  if (const CodeBlock* arrows = block_in(page, "The arrows"))
    append(check_arrows(*arrows, read_text(root / "CMakeLists.txt")));
  append(check_trip_count(page, nullptr));
  return problems;
}

std::string listed(const Problems& problems) {
  std::string text;
  for (const std::string& p : problems) text += "\n  " + p;
  return text;
}

bool mentions(const Problems& problems, const std::string& text) {
  return std::any_of(problems.begin(), problems.end(),
                     [&](const std::string& p) { return p.find(text) != std::string::npos; });
}

const char* const kPage = "docs/architecture.md";

}  // namespace

TEST_CASE("docs/architecture.md: every path it writes exists") {
  const fs::path root = repository_root();
  const std::string text = read_text(root / kPage);
  REQUIRE_MESSAGE(!text.empty(), "cannot read ", (root / kPage).string());
  const Problems problems = check_paths(parse_page(text), root);
  CHECK_MESSAGE(problems.empty(), listed(problems));
  const Problems links = check_links(text, (root / kPage).parent_path());
  CHECK_MESSAGE(links.empty(), listed(links));
}

TEST_CASE("docs/architecture.md: every function of its tables is in the file its row names") {
  const fs::path root = repository_root();
  const Page page = parse_page(read_text(root / kPage));
  SourceCache sources;
  int checked = 0;
  const Problems problems = check_function_tables(page, root, sources, &checked);
  CHECK_MESSAGE(problems.empty(), listed(problems));
  // The trip, the setup and the algorithms name dozens: a page whose tables stopped being read
  // must not pass for a true one.
  CHECK(checked >= 40);
}

TEST_CASE("docs/architecture.md: every other C++ name it writes is in a file it names") {
  const fs::path root = repository_root();
  const Page page = parse_page(read_text(root / kPage));
  Problems problems;
  const CodeBlock* rooms = block_in(page, "The rooms");
  REQUIRE(rooms != nullptr);
  const RoomsMap map = parse_rooms(*rooms, problems);
  SourceCache sources;
  const Problems names = check_names(page, named_files(page, map, root), root, sources);
  problems.insert(problems.end(), names.begin(), names.end());
  CHECK_MESSAGE(problems.empty(), listed(problems));
}

TEST_CASE("docs/architecture.md: the rooms map lists what is there, and all of a room it lists file by file") {
  const fs::path root = repository_root();
  const Page page = parse_page(read_text(root / kPage));
  const CodeBlock* rooms = block_in(page, "The rooms");
  REQUIRE(rooms != nullptr);
  Problems problems;
  const RoomsMap map = parse_rooms(*rooms, problems);
  const Problems more = check_rooms(map, root);
  problems.insert(problems.end(), more.begin(), more.end());
  CHECK_MESSAGE(problems.empty(), listed(problems));
  // The four libraries and the rooms of comm, whose files the map lists one by one.
  for (const char* folder : {"core/", "kernels/", "comm/", "nn/", "comm/algorithms/", "comm/transport/"})
    CHECK_MESSAGE(std::find(map.entries.begin(), map.entries.end(), folder) != map.entries.end(), "the map lacks ",
                  folder);
  CHECK(map.children.at("comm/algorithms/").size() >= 7);
}

TEST_CASE("docs/architecture.md: the arrows are CMakeLists.txt's link lines") {
  const fs::path root = repository_root();
  const Page page = parse_page(read_text(root / kPage));
  const CodeBlock* arrows = block_in(page, "The arrows");
  REQUIRE(arrows != nullptr);
  const Problems problems = check_arrows(*arrows, read_text(root / "CMakeLists.txt"));
  CHECK_MESSAGE(problems.empty(), listed(problems));
}

TEST_CASE("docs/architecture.md: the trip counts the files it runs through") {
  const Page page = parse_page(read_text(repository_root() / kPage));
  int rows = 0;
  const Problems problems = check_trip_count(page, &rows);
  CHECK_MESSAGE(problems.empty(), listed(problems));
  CHECK(rows >= 15);  // from Linear::backward to the wire and back
}

TEST_CASE("the architecture page checker finds a renamed function, a missing file, a wrong count") {
  const fs::path root = repository_root();
  const std::string real = read_text(root / kPage);
  REQUIRE(!real.empty());
  // The page as it is passes: the cases below fail because of their one change, not of the page.
  const Problems clean = check_page(real, root);
  REQUIRE_MESSAGE(clean.empty(), listed(clean));

  auto changed = [&](const std::string& from, const std::string& to) {
    std::string text = real;
    const size_t at = text.find(from);
    REQUIRE_MESSAGE(at != std::string::npos, "the page no longer contains ", from, "; pick another example");
    text.replace(at, from.size(), to);
    return check_page(text, root);
  };

  SUBCASE("a function of the trip renamed") {
    const Problems problems = changed("`Reducer::launch_ready_buckets`", "`Reducer::launch_buckets`");
    CHECK_MESSAGE(mentions(problems, "`Reducer::launch_buckets`"), listed(problems));
  }
  SUBCASE("a function put in a file that only calls it") {
    // peer_group.cpp calls run_streams; collective_engine.cpp defines it.
    const Problems problems = changed("`ring_group_all_reduce`, `PeerGroup::ring`", "`run_streams`");
    CHECK_MESSAGE(mentions(problems, "peer_group.cpp does not define `run_streams`"), listed(problems));
  }
  SUBCASE("a file that does not exist") {
    std::smatch m;
    REQUIRE(std::regex_search(real, m, std::regex("`([a-z]+/[a-z_/]+)\\.h`")));
    const std::string gone = m[1].str() + "_gone.h";
    const Problems problems = changed(m[0].str(), "`" + gone + "`");
    CHECK_MESSAGE(mentions(problems, gone), listed(problems));
  }
  SUBCASE("a file left off a room that lists its files") {
    const Problems problems = changed("    rabenseifner.*", "    rabenseifner_gone.*");
    CHECK_MESSAGE(mentions(problems, "but not comm/algorithms/rabenseifner.h"), listed(problems));
  }
  SUBCASE("a type renamed in the prose") {
    const Problems problems = changed("`GradBucket`", "`GradientBucket`");
    CHECK_MESSAGE(mentions(problems, "`GradientBucket`"), listed(problems));
  }
  SUBCASE("an arrow that CMakeLists.txt does not draw") {
    const Problems problems = changed("core  <-  comm     <-  nn", "core  <-  comm     <-  nn  <-  kernels");
    CHECK_MESSAGE(mentions(problems, "kernels uses nn"), listed(problems));
  }
  SUBCASE("a wrong count of files") {
    std::smatch m;
    REQUIRE(std::regex_search(real, m, std::regex("runs through (\\d+) files")));
    const std::string wrong = "runs through " + std::to_string(std::stoul(m[1].str()) + 1) + " files";
    const Problems problems = changed(m[0].str(), wrong);
    CHECK_MESSAGE(mentions(problems, wrong), listed(problems));
  }
}
