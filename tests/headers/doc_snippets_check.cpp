// CTest test doc_snippets: every code block in a doc comment under include/ (/// ``` ... /// ```) and every
// C++ block (```cpp ... ```) of README.md and of each docs/*.md page is followed by a line "(From <file>..."
// naming a compiled example or test (in Markdown the file name may be in backquotes), and each of its lines
// is found in that file (leading and repeated spaces ignored), so a snippet cannot drift from the code that
// compiles it.
//   doc_snippets_check <source dir>     (the checkout: include/, README.md, docs/ and the named files are read
//                                        there)
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::string squeeze(const std::string& line) {
  std::string out;
  for (char c : line) {
    if (c == ' ' || c == '\t') {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::vector<std::string> read_lines(const fs::path& path) {
  std::vector<std::string> lines;
  std::ifstream in{path};
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A line's text inside a block: for a header, what follows "///" (and one space), false for a line that is
// not a doc comment; for a Markdown page, the line itself.
bool block_text(const std::string& line, bool header, std::string& text) {
  if (!header) {
    text = line;
    return true;
  }
  const auto start = line.find_first_not_of(" \t");
  if (start == std::string::npos || line.compare(start, 3, "///") != 0) return false;
  text = line.substr(start + 3);
  if (!text.empty() && text.front() == ' ') text.erase(0, 1);
  return true;
}

struct counts {
  int blocks = 0;
  int failures = 0;
};

void check_file(const fs::path& root, const fs::path& file, bool header, counts& n) {
  const auto lines = read_lines(file);
  const auto where = [&](std::size_t i) { return fs::relative(file, root).string() + ":" + std::to_string(i + 1); };
  const std::string open_fence = header ? "```" : "```cpp";
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string text;
    if (!block_text(lines[i], header, text) || text != open_fence) continue;
    std::vector<std::string> code;
    std::size_t end = i + 1;
    for (; end < lines.size(); ++end) {
      if (!block_text(lines[end], header, text)) break;
      if (text == "```") break;
      code.push_back(text);
    }
    ++n.blocks;
    std::string from;
    if (end + 1 < lines.size() && block_text(lines[end + 1], header, from) && from.rfind("(From ", 0) == 0) {
      from = from.substr(6);
      if (!from.empty() && from.front() == '`') from.erase(0, 1);
      from = from.substr(0, from.find_first_of(",)`"));
    } else {
      std::fprintf(stderr, "%s: code block without a \"(From <file>\" line after it\n", where(i).c_str());
      ++n.failures;
      i = end;
      continue;
    }
    const auto source = read_lines(root / from);
    if (source.empty()) {
      std::fprintf(stderr, "%s: %s is missing or empty\n", where(i).c_str(), from.c_str());
      ++n.failures;
    }
    std::vector<std::string> squeezed;
    for (const auto& line : source) squeezed.push_back(squeeze(line));
    for (std::size_t k = 0; k < code.size(); ++k) {
      const std::string want = squeeze(code[k]);
      if (want.empty()) continue;
      const bool found = std::any_of(squeezed.begin(), squeezed.end(),
                                     [&](const std::string& have) { return have.find(want) != std::string::npos; });
      if (!found) {
        std::fprintf(stderr, "%s: not in %s: %s\n", where(i + 1 + k).c_str(), from.c_str(), want.c_str());
        ++n.failures;
      }
    }
    i = end;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: doc_snippets_check SOURCE_DIR\n");
    return 2;
  }
  const fs::path root{argv[1]};
  std::vector<fs::path> headers;
  for (const auto& entry : fs::recursive_directory_iterator(root / "include"))
    if (entry.path().extension() == ".hpp") headers.push_back(entry.path());
  std::sort(headers.begin(), headers.end());
  counts n;
  for (const auto& header : headers) check_file(root, header, true, n);
  const int header_blocks = n.blocks;
  std::vector<fs::path> pages{root / "README.md"};
  std::vector<fs::path> guides;
  for (const auto& entry : fs::directory_iterator(root / "docs"))
    if (entry.path().extension() == ".md") guides.push_back(entry.path());
  std::sort(guides.begin(), guides.end());
  pages.insert(pages.end(), guides.begin(), guides.end());
  for (const auto& page : pages) check_file(root, page, false, n);
  const int blocks = n.blocks;
  const int failures = n.failures;
  std::printf("%d code blocks in doc comments and %d in README.md and docs/*.md (%zu pages); "
              "%d lines not found in their sources\n",
              header_blocks, blocks - header_blocks, pages.size(), failures);
  return failures == 0 && header_blocks > 0 ? 0 : 1;
}
