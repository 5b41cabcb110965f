// The rules of codegen/'s layout (issue 35), checked on the source tree so that they stay true:
// no function over 250 lines and no file over 900, the stage ring's protocol in the device
// headers only, and one place that decides which arch runs wgmma.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path root = LADLE_SOURCE_DIR;

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<fs::path> sources(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_regular_file() && (ext == ".cpp" || ext == ".h" || ext == ".cuh")) out.push_back(entry.path());
  }
  return out;
}

// The code of a C++ file without comments, string and character literals (raw strings too): what
// is left is what braces and keywords are counted in.
std::string code_only(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (text.compare(i, 2, "//") == 0) {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (text.compare(i, 2, "/*") == 0) {
      const std::size_t end = text.find("*/", i + 2);
      for (std::size_t j = i; j < std::min(end + 2, text.size()); ++j) out += text[j] == '\n' ? '\n' : ' ';
      i = end == std::string::npos ? text.size() : end + 2;
    } else if (text[i] == 'R' && i + 1 < text.size() && text[i + 1] == '"' && (i == 0 || !std::isalnum(static_cast<unsigned char>(text[i - 1])))) {
      const std::size_t open = text.find('(', i);
      const std::string close = ")" + text.substr(i + 2, open - i - 2) + "\"";
      const std::size_t end = text.find(close, open);
      for (std::size_t j = i; j < std::min(end + close.size(), text.size()); ++j) out += text[j] == '\n' ? '\n' : ' ';
      out += "\"\"";
      i = end == std::string::npos ? text.size() : end + close.size();
    } else if (text[i] == '"' || text[i] == '\'') {
      const char quote = text[i++];
      while (i < text.size() && text[i] != quote && text[i] != '\n') i += text[i] == '\\' ? 2 : 1;
      ++i;
      out += "\"\"";
    } else {
      out += text[i++];
    }
  }
  return out;
}

struct Function {
  int first_line = 0, lines = 0;
};

// The outermost brace blocks that are not a namespace, class, struct, enum, union or
// initialiser: the bodies of functions (lambdas count with the function that holds them).
std::vector<Function> functions(const std::string& text) {
  const std::string code = code_only(text);
  std::vector<Function> out;
  std::vector<bool> stack;  // per open brace: whether it opened a function body at the top
  int line = 1, start_line = 0;
  std::size_t statement = 0;  // where the text before the current brace began
  bool inside = false;
  for (std::size_t i = 0; i < code.size(); ++i) {
    const char c = code[i];
    if (c == '\n') ++line;
    if (c == ';' || c == '}') statement = i + 1;
    if (c == '{') {
      const std::string before = code.substr(statement, i - statement);
      static const std::regex scope(R"((^|\W)(namespace|struct|class|enum|union|extern "")\W)");
      static const std::regex initialiser(R"(=\s*$)");
      const bool body = !inside && !std::regex_search(before, scope) && before.find(')') != std::string::npos &&
                        !std::regex_search(before, initialiser);
      if (body) inside = true, start_line = line;
      stack.push_back(body);
      statement = i + 1;
    } else if (c == '}' && !stack.empty()) {
      if (stack.back()) {
        inside = false;
        out.push_back({start_line, line - start_line + 1});
      }
      stack.pop_back();
    }
  }
  return out;
}

}  // namespace

TEST_CASE("codegen: no file over 900 lines and no function over 250", "[layout]") {
  int files = 0, bodies = 0;
  for (const fs::path& path : sources(root / "codegen")) {
    const std::string text = read(path);
    const auto lines = std::count(text.begin(), text.end(), '\n');
    INFO(path.lexically_relative(root).string() << ": " << lines << " lines");
    CHECK(lines <= 900);
    for (const Function& f : functions(text)) {
      INFO("the function at line " << f.first_line << ": " << f.lines << " lines");
      CHECK(f.lines <= 250);
      ++bodies;
    }
    ++files;
  }
  CHECK(files > 20);
  CHECK(bodies > 100);  // the scan found the functions it is meant to measure
}

TEST_CASE("the layout scan measures functions as written", "[layout]") {
  const std::string text =
      "namespace a {\nstruct S { int f() { return 1; } };\nint g(int x) {\n  auto l = [&] { return \"}\"; };\n"
      "  // }\n  if (x) {\n    return 2;\n  }\n  return R\"(}\n})\" [0];\n}\nconst int table[] = {1, 2};\n}\n";
  const auto found = functions(text);
  REQUIRE(found.size() == 2);  // S::f and g
  CHECK(found[0].first_line == 2);
  CHECK(found[0].lines == 1);
  CHECK(found[1].first_line == 3);
  CHECK(found[1].lines == 9);
}

TEST_CASE("codegen: the stage ring's protocol, the register split and the ping-pong live in the device headers", "[layout]") {
  // A generator emits calls of ladle_stage_ring; the mbarrier protocol (init counts, expect_tx,
  // phase parity) is written in codegen/device/pipeline.cuh alone.
  for (const fs::path& path : sources(root / "codegen")) {
    if (path.extension() == ".cuh") continue;
    const std::string text = read(path);
    INFO(path.lexically_relative(root).string());
    CHECK(text.find("ladle_mbarrier_arrive_expect_tx(") == std::string::npos);
    CHECK(text.find("ladle_mbarrier_init(") == std::string::npos);
    CHECK(text.find("ladle_setmaxnreg_") == std::string::npos);  // the register split: ladle_producer_warpgroup
    CHECK(text.find("ladle_named_barrier_arrive(") == std::string::npos);  // turns handed over: ladle_pingpong
  }
  const std::string pipeline = read(root / "codegen/device/pipeline.cuh");
  CHECK(pipeline.find("struct ladle_stage_ring") != std::string::npos);
  CHECK(pipeline.find("struct ladle_pingpong") != std::string::npos);
}

TEST_CASE("ladle: one place decides which arch runs wgmma", "[layout]") {
  // Comparing arch strings against sm_90 is codegen/cuda/target.cpp's alone (cuda::target).
  static const std::regex compare(R"(("(sm|compute)_9\d\w*"\s*[!=]=)|([!=]=\s*"(sm|compute)_9\d)|(rfind\("sm_9))");
  for (const char* layer : {"codegen", "ops", "runtime", "tools"}) {
    for (const fs::path& path : sources(root / layer)) {
      if (path.filename() == "target.cpp") continue;
      INFO(path.lexically_relative(root).string());
      CHECK_FALSE(std::regex_search(read(path), compare));
    }
  }
}
