#include "cuda_source.h"

#include <cctype>
#include <map>
#include <sstream>

#include <ladle/runtime/error.h>

#include "../../render_c.h"

namespace ladle::cuda::detail {


bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

int next_power_of_two(std::int64_t x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

const char* storage_type(DType type) {
  switch (type) {
    case DType::f16: return "ladle_f16";
    case DType::bf16: return "ladle_bf16";
    default: return "float";
  }
}

bool floating(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

// C++ and CUDA words an input's name could plausibly be: never an identifier of ours.
const std::set<std::string>& cpp_words() {
  static const std::set<std::string> names = {
      "auto", "bool", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
      "extern", "float", "for", "goto", "if", "inline", "int", "long", "new", "delete", "register", "return",
      "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
      "volatile", "while", "class", "namespace", "template", "this", "true", "false", "private", "public",
      "operator", "asm", "export", "final", "override", "try", "catch", "throw", "using", "virtual", "friend",
      "mutable", "explicit", "typename", "constexpr", "nullptr", "threadIdx", "blockIdx", "blockDim", "gridDim",
      "warpSize", "min", "max", "std"};
  return names;
}

namespace {

std::string sanitized(const std::string& name) {
  std::string id;
  for (char c : name) id += std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '_';
  if (id.empty() || std::isdigit(static_cast<unsigned char>(id[0]))) id = "_" + id;
  return id;
}

bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Every identifier of `source` outside // comments and literals, once each (numbers skipped).
std::set<std::string> source_names(const std::string& source) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < source.size();) {
    if (source.compare(i, 2, "//") == 0) {
      i = source.find('\n', i);
      if (i == std::string::npos) break;
    } else if (source[i] == '"' || source[i] == '\'') {  // a literal's text (asm strings) names nothing
      const char quote = source[i++];
      while (i < source.size() && source[i] != quote && source[i] != '\n') i += source[i] == '\\' ? 2 : 1;
      ++i;
    } else if (word_char(source[i]) && !std::isdigit(static_cast<unsigned char>(source[i]))) {
      std::size_t end = i;
      while (end < source.size() && word_char(source[end])) ++end;
      names.insert(source.substr(i, end - i));
      i = end;
    } else if (word_char(source[i])) {  // 1.0f, 0x3FFFFu
      while (i < source.size() && (word_char(source[i]) || source[i] == '.')) ++i;
    } else {
      ++i;
    }
  }
  return names;
}

}  // namespace

std::vector<std::string> placeholder_identifiers(const std::vector<ir::Input>& inputs) {
  std::vector<std::string> ids;
  for (std::size_t i = 0; i < inputs.size(); ++i) ids.push_back("in" + std::to_string(i) + "_" + sanitized(inputs[i].name));
  return ids;
}

std::vector<std::string> input_identifiers(const std::vector<ir::Input>& inputs, const std::string& probe,
                                           const std::vector<std::string>& placeholders) {
  // The probe's names: the kernel's own, and per input the suffixes its text derives from the
  // input's name (q -> q_head, q_stride_t, q_map, ...). A placeholder is never the prefix of
  // another input's (the index follows "in" and ends at "_").
  std::set<std::string> taken;
  std::vector<std::set<std::string>> suffixes(placeholders.size());
  for (const std::string& name : source_names(probe)) {
    bool derived = false;
    for (std::size_t i = 0; i < placeholders.size(); ++i)
      if (name.rfind(placeholders[i], 0) == 0) suffixes[i].insert(name.substr(placeholders[i].size())), derived = true;
    if (!derived) taken.insert(name);
  }
  std::vector<std::string> ids;
  for (const ir::Input& in : inputs) ids.push_back(sanitized(in.name));
  // An input keeps its own name unless a name the text derives from it is the kernel's own, a
  // C++ word, another input's, ladle's (ladle_*, LADLE_*) or a placeholder's form (in<digit>...).
  std::map<std::string, int> uses;
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (const std::string& suffix : suffixes[i]) ++uses[ids[i] + suffix];
  for (std::size_t i = 0; i < ids.size(); ++i) {
    bool clash = ids[i].rfind("ladle_", 0) == 0 || ids[i].rfind("LADLE_", 0) == 0 ||
                 (ids[i].rfind("in", 0) == 0 && ids[i].size() > 2 && std::isdigit(static_cast<unsigned char>(ids[i][2])));
    for (const std::string& suffix : suffixes[i]) {
      const std::string name = ids[i] + suffix;
      clash = clash || uses[name] > 1 || taken.count(name) > 0 || cpp_words().count(name) > 0;
    }
    if (clash) ids[i] = placeholders[i];
  }
  return ids;
}


// Host-independent helpers every kernel of the family uses: 16-bit storage types without
// cuda_fp16.h (so NVRTC needs no include path) and typed loads/stores through float.
const char* const storage_helpers = "#include <ladle/codegen/device/storage.cuh>\n";

const char* const tensor_core_helpers = "#include <ladle/codegen/device/tensor_core.cuh>\n";

std::string comment_block(const std::string& text) {
  std::string out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) out += line.empty() ? "//\n" : "// " + line + "\n";
  return out;
}

std::uint64_t fnv1a(const std::string& bytes, std::uint64_t h) {
  for (char c : bytes) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

void emit_producer_exit(Code& c) {
  c.out();
  c("}");
  c("return;");
  c.out();
  c("}");
}

std::string hex(std::uint64_t value) {
  static const char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[i] = digits[value & 15];
  return out;
}


void check_types(const std::string& who, const ir::Variant& variant, const KernelTypes& types) {
  const auto fail = [&](const std::string& what) { throw InvalidArgument(who + ": " + what); };
  if (types.input_types.size() != variant.inputs.size())
    fail("input_types has " + std::to_string(types.input_types.size()) + " entries, expected one per input (" +
         std::to_string(variant.inputs.size()) + ")");
  for (std::size_t i = 0; i < variant.inputs.size(); ++i)
    if (variant.inputs[i].kind != ir::InputKind::scalar && !floating(types.input_types[i]))
      fail("input " + variant.inputs[i].name + " has dtype " + dtype_name(types.input_types[i]) +
           ", expected f32, f16 or bf16");
  if (!floating(types.output_type)) fail(std::string("output_type ") + dtype_name(types.output_type) + ", expected f32, f16 or bf16");
  if (types.initial_state && !floating(types.initial_state_type))
    fail(std::string("initial_state_type ") + dtype_name(types.initial_state_type) + ", expected f32, f16 or bf16");
  if (types.varlen && types.cu_seqlens_type != DType::i32 && types.cu_seqlens_type != DType::i64)
    fail(std::string("cu_seqlens_type ") + dtype_name(types.cu_seqlens_type) + ", expected i32 or i64");
}

std::string types_key(const KernelTypes& types) {
  std::string key = std::string(types.reverse ? " R" : "") + (types.varlen ? " L" : "") + (types.initial_state ? " I" : "") +
                    (types.final_state ? " F" : "") + dtype_name(types.output_type) +
                    dtype_name(types.initial_state_type) + dtype_name(types.cu_seqlens_type);
  for (DType t : types.input_types) key += dtype_name(t);
  return key;
}

std::string types_line(const ir::Variant& variant, const std::vector<std::string>& ids, const KernelTypes& types) {
  std::string line;
  for (std::size_t k = 0; k < variant.inputs.size(); ++k)
    if (variant.inputs[k].kind != ir::InputKind::scalar) line += ids[k] + " " + dtype_name(types.input_types[k]) + ", ";
  line += std::string("o ") + dtype_name(types.output_type) + ", state f32";
  if (types.initial_state) line += std::string(" (initial_state ") + dtype_name(types.initial_state_type) + ")";
  return line;
}

void declare_params(const ir::Variant& variant, const std::vector<std::string>& ids, const KernelTypes& types,
                    std::vector<std::string>& declarations, std::vector<KernelParam>& params) {
  using Role = KernelParam::Role;
  using Type = KernelParam::Type;
  const auto param = [&](const std::string& c_type, const std::string& name, Type type, Role role, int input = -1) {
    declarations.push_back(c_type + (type == Type::pointer ? " __restrict__ " : " ") + name);
    params.push_back({name, c_type, type, role, input});
  };
  for (std::size_t k = 0; k < variant.inputs.size(); ++k) {
    const ir::Input& in = variant.inputs[k];
    const std::string& name = ids[k];
    const int index = static_cast<int>(k);
    if (in.kind == ir::InputKind::scalar) {
      param("float", name, Type::f32, Role::input, index);
      continue;
    }
    param(std::string("const ") + storage_type(types.input_types[k]) + "*", name, Type::pointer, Role::input, index);
    param("long long", name + "_stride_b", Type::i64, Role::input_stride_b, index);
    if (in.kind != ir::InputKind::head) param("long long", name + "_stride_t", Type::i64, Role::input_stride_t, index);
    param("long long", name + "_stride_h", Type::i64, Role::input_stride_h, index);
    if (in.kind == ir::InputKind::token_key || in.kind == ir::InputKind::token_value || in.kind == ir::InputKind::head_key)
      param("long long", name + "_stride_d", Type::i64, Role::input_stride_d, index);
    param("int", name + "_heads", Type::i32, Role::input_heads, index);
  }
  param(std::string(storage_type(types.output_type)) + "*", "o", Type::pointer, Role::output);
  param("long long", "o_stride_b", Type::i64, Role::output_stride_b);
  param("long long", "o_stride_t", Type::i64, Role::output_stride_t);
  param("long long", "o_stride_h", Type::i64, Role::output_stride_h);
  param("long long", "o_stride_d", Type::i64, Role::output_stride_d);
  if (types.initial_state)
    param(std::string("const ") + storage_type(types.initial_state_type) + "*", "initial_state", Type::pointer, Role::initial_state);
  if (types.final_state) param("float*", "final_state", Type::pointer, Role::final_state);
  if (types.varlen)
    param(types.cu_seqlens_type == DType::i32 ? "const int*" : "const long long*", "cu_seqlens", Type::pointer, Role::cu_seqlens);
  param("int", "B", Type::i32, Role::batch);
  param("int", "T", Type::i32, Role::tokens);
  param("int", "H", Type::i32, Role::heads);
  param("int", "K", Type::i32, Role::key_dim);
  param("int", "V", Type::i32, Role::value_dim);
}

InputUse input_use(const ir::Variant& variant) {
  const std::size_t n = variant.inputs.size();
  InputUse use{std::vector<bool>(n, false), std::vector<bool>(n, false), std::vector<bool>(n, false)};
  for (std::size_t s = 0; s < ir::slot_count; ++s) {
    const ir::Slot slot = static_cast<ir::Slot>(s);
    const bool key = slot == ir::Slot::q_feature || slot == ir::Slot::k_feature || slot == ir::Slot::log_decay_k || slot == ir::Slot::bonus;
    const bool value = slot == ir::Slot::v || slot == ir::Slot::log_decay_v;
    for (const ir::Node& node : variant.slots[s].nodes)
      if (node.op == ir::Op::input) {
        use.used[node.input] = true;
        use.key_side[node.input] = use.key_side[node.input] || key;
        use.value_side[node.input] = use.value_side[node.input] || value;
      }
  }
  return use;
}

std::vector<std::size_t> slot_inputs(const ir::Variant& variant, ir::Slot slot) {
  std::vector<std::size_t> out;
  std::vector<bool> seen(variant.inputs.size(), false);
  for (const ir::Node& node : variant.slot(slot).nodes)
    if (node.op == ir::Op::input && !seen[static_cast<std::size_t>(node.input)]) {
      seen[static_cast<std::size_t>(node.input)] = true;
      out.push_back(static_cast<std::size_t>(node.input));
    }
  return out;
}

std::string render_slot(const ir::Variant& variant, const std::vector<std::string>& ids, ir::Slot slot,
                        const std::string& suffix) {
  return render_expr(variant, ids, variant.slot(slot), suffix);
}

std::string render_expr(const ir::Variant& variant, const std::vector<std::string>& ids, const ir::Expr& expr,
                        const std::string& suffix) {
  return ir::render_c(variant, expr, [&](const ir::Input& in, std::int32_t k) -> std::string {
    switch (in.kind) {
      case ir::InputKind::token_key:
      case ir::InputKind::token_value:
      case ir::InputKind::head_key: return ids[k] + suffix;  // bound as [B,T,H,K] with a zero token stride
      case ir::InputKind::token_head: return ids[k] + "_t";
      case ir::InputKind::head: return ids[k] + "_value";
      case ir::InputKind::scalar: return ids[k];
      case ir::InputKind::pair: break;  // validate() keeps pair inputs out of recurrences
    }
    return "0.0f";
  });
}

std::string row_load(const std::vector<std::string>& ids, std::size_t k, const std::string& index) {
  return "ladle_load(" + ids[k] + " + " + ids[k] + "_row + " + index + " * " + ids[k] + "_stride_d)";
}

void token_rows(Code& c, const ir::Variant& variant, const std::vector<std::string>& ids, const std::vector<bool>& used,
                bool guard_live) {
  const auto& inputs = variant.inputs;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const auto kind = inputs[k].kind;
    if (!used[k] || kind == ir::InputKind::head || kind == ir::InputKind::scalar) continue;
    // (void): the key-side loop reads only key-side rows, the value-side loop value-side.
    c("const long long " + ids[k] + "_row = b * " + ids[k] + "_stride_b + t * " + ids[k] + "_stride_t + " + ids[k] +
      "_head * " + ids[k] + "_stride_h; (void)" + ids[k] + "_row;");
  }
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (used[k] && inputs[k].kind == ir::InputKind::token_head) {
      const std::string load = "ladle_load(" + ids[k] + " + " + ids[k] + "_row)";
      c("const float " + ids[k] + "_t = " + (guard_live ? "live ? " + load + " : 0.0f" : load) + "; (void)" + ids[k] +
        "_t;");
    }
}

void emit_sequence_bounds(Code& c, bool segmented, bool varlen) {
  if (segmented) {
    c("// The block's segment: tokens [seg[1], seg[2]) of batch row seg[0], part of sequence seg[3].");
    c("const long long* const seg = segments + 8LL * n;");
    c("const int b = static_cast<int>(seg[0]);");
    c("const long long bos = seg[1], eos = seg[2];");
  } else if (varlen) {
    c("const int b = 0;");
    c("const long long bos = cu_seqlens[n], eos = cu_seqlens[n + 1];");
  } else {
    c("const int b = n;");
    c("const long long bos = 0, eos = T;");
  }
}

}  // namespace ladle::cuda::detail
