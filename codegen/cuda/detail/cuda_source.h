// What the CUDA kernel families of codegen/ share while building source text: C names
// for the variant's inputs, the 16-bit storage helpers, the kernel parameter list and an
// indenting line writer. Internal to codegen (not installed).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <ladle/dsl/ir.h>

#include "../../kernel.h"

namespace ladle::cuda::detail {

bool power_of_two(int x);
int next_power_of_two(std::int64_t x);
const char* storage_type(DType type);  // ladle_f16, ladle_bf16 or float
bool floating(DType t);

// Every input as in<i>_<name>: names no kernel text uses for anything else.
std::vector<std::string> placeholder_identifiers(const std::vector<ir::Input>& inputs);
// One C identifier per input: its own name where that is safe, else its placeholder. `probe` is
// the kernel's source generated with the placeholders: the names it takes that are not derived
// from an input are the kernel's own, and those derived from one tell which suffixes the text
// appends to that input's name.
std::vector<std::string> input_identifiers(const std::vector<ir::Input>& inputs, const std::string& probe,
                                           const std::vector<std::string>& placeholders);

// A kernel whose inputs keep their own names wherever the kernel's text leaves them free, without
// a list of the text's names to keep up to date: `generate(id)` (id: one C identifier per input)
// runs first with placeholders, which no text uses otherwise, and reading that text tells which
// names are free. Generating is cheap beside compiling, and its result is cached.
template <class Kernel, class Generate>
Kernel with_input_names(const std::vector<ir::Input>& inputs, Generate generate) {
  const std::vector<std::string> placeholders = placeholder_identifiers(inputs);
  Kernel probe = generate(placeholders);
  const std::vector<std::string> id = input_identifiers(inputs, probe.source, placeholders);
  if (id == placeholders) return probe;
  return generate(id);
}

// The 16-bit storage types and typed loads/stores through float (no cuda_fp16.h, so NVRTC
// needs no include path), plus LADLE_UNROLL.
extern const char* const storage_helpers;
// The tensor-core helpers of the chunked and attention families (ldmatrix, mma.sync
// m16n8k16 bf16, ex2, bf16 packing), guarded by LADLE_CHUNKED_HELPERS; a host emulation
// defines its own before including a kernel.
extern const char* const tensor_core_helpers;

std::string comment_block(const std::string& text);  // "// " before every line
std::uint64_t fnv1a(const std::string& bytes, std::uint64_t h = 0xcbf29ce484222325ull);
std::string hex(std::uint64_t value);

// Checks the dtypes of a spec against the variant (throws InvalidArgument prefixed `who`).
void check_types(const std::string& who, const ir::Variant& variant, const KernelTypes& types);
// "|R L I F ..." for a kernel name: everything in `types` that changes the source.
std::string types_key(const KernelTypes& types);
// "q bf16, k bf16, ..., o bf16, state f32 (initial_state bf16)"
std::string types_line(const ir::Variant& variant, const std::vector<std::string>& ids, const KernelTypes& types);

// The parameters of every kernel of the recurrence families, in order: the inputs (data,
// strides, heads), o and its strides, the states, cu_seqlens, B T H K V. Appends the C
// declarations and the launcher's description.
void declare_params(const ir::Variant& variant, const std::vector<std::string>& ids, const KernelTypes& types,
                    std::vector<std::string>& declarations, std::vector<KernelParam>& params);

// Which inputs the slots read: all of them, and those of the key side (q, k features, key
// gate) and of the value side (v, value gate).
struct InputUse {
  std::vector<bool> used, key_side, value_side;
};
InputUse input_use(const ir::Variant& variant);
// The inputs a slot's expression reads, each once, in the order it first reads them.
std::vector<std::size_t> slot_inputs(const ir::Variant& variant, ir::Slot slot);

// A slot's expression as C, reading each input from the generator's locals: token_key and
// token_value inputs as <id><suffix> (x_i at a key row, x_j at a value column), token_head
// as <id>_t, head as <id>_value, scalars as the parameter.
std::string render_slot(const ir::Variant& variant, const std::vector<std::string>& ids, ir::Slot slot,
                        const std::string& suffix);
// Any expression over the variant's inputs (a slot's derivative), read from the same locals.
std::string render_expr(const ir::Variant& variant, const std::vector<std::string>& ids, const ir::Expr& expr,
                        const std::string& suffix);
// The load of input k's feature `index` at the current token: ladle_load(x + x_row + index * x_stride_d).
std::string row_load(const std::vector<std::string>& ids, std::size_t k, const std::string& index);

class Code;
// The per-token locals every recurrence generator needs once `t` is known: the row offset
// <id>_row of every token input it reads, and the value <id>_t of every per-token head input
// (0 where `live` is false, when `guard_live` is set: a chunk's padding tokens).
void token_rows(Code& c, const ir::Variant& variant, const std::vector<std::string>& ids, const std::vector<bool>& used,
                bool guard_live);

// The block's sequence n as b (batch row), bos and eos (its tokens [bos, eos) of row b): a row of the
// `segments` table (segmented), cu_seqlens (varlen), or [0, T) of row n.
void emit_sequence_bounds(Code& c, bool segmented, bool varlen);

// Lines with indentation.
class Code {
 public:
  Code& operator()(const std::string& line) {
    if (!line.empty()) text_ += std::string(static_cast<std::size_t>(indent_) * 2, ' ');
    text_ += line + "\n";
    return *this;
  }
  void in() { ++indent_; }
  void out() { --indent_; }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  int indent_ = 0;
};

// The end of a warp-specialised kernel's producer role: closes its copying thread's block,
// returns, and closes the role's block (opened by ladle_producer_warpgroup's test).
void emit_producer_exit(Code& c);

}  // namespace ladle::cuda::detail
