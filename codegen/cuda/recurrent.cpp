#include "recurrent.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>

#include <ladle/runtime/error.h>

#include "detail/cuda_source.h"
#include "../render_c.h"

namespace ladle::cuda {

using namespace detail;

RecurrentTile default_tile(std::int64_t key_dim, std::int64_t value_dim) {
  RecurrentTile tile;
  tile.block_k = std::max(16, next_power_of_two(key_dim));
  // At block_k 256 a 32-column tile leaves ptxas spilling; 16 does not.
  // At block_k 128 a 64-column tile measured faster than 32 columns.
  const int widest = tile.block_k >= 256 ? 16 : tile.block_k == 128 ? 64 : 32;
  tile.block_v = std::clamp(next_power_of_two(value_dim), 8, widest);
  tile.warps = tile.block_k >= 128 ? 8 : 4;  // 8 warps measured faster than 4 at K = V = 128
  return tile;
}

std::string to_string(const RecurrentTile& tile) {
  return "block_k=" + std::to_string(tile.block_k) + " block_v=" + std::to_string(tile.block_v) +
         " warps=" + std::to_string(tile.warps);
}

namespace {

std::vector<std::string> tile_rules(const RecurrentTile& tile) {
  std::vector<std::string> problems;
  const int threads = 32 * tile.warps;
  if (tile.warps != 1 && tile.warps != 2 && tile.warps != 4 && tile.warps != 8 && tile.warps != 16)
    problems.push_back("warps = " + std::to_string(tile.warps) + ", expected 1, 2, 4, 8 or 16");
  if (!power_of_two(tile.block_k) || tile.block_k > 256)
    problems.push_back("block_k = " + std::to_string(tile.block_k) + ", expected a power of two up to 256");
  if (!power_of_two(tile.block_v) || tile.block_v > threads)
    problems.push_back("block_v = " + std::to_string(tile.block_v) + ", expected a power of two up to the " +
                       std::to_string(threads) + " threads");
  if (problems.empty()) {
    const int rows = (tile.block_k + threads / tile.block_v - 1) / (threads / tile.block_v);
    if (rows > 64)
      problems.push_back("each thread would keep " + std::to_string(rows) +
                         " state rows in registers (block_k * block_v / threads), expected at most 64");
  }
  return problems;
}

}  // namespace

std::vector<std::string> validate_tile(const RecurrentTile& tile, std::int64_t key_dim, std::int64_t value_dim, const ir::Variant& variant) {
  std::vector<std::string> problems = validate_tile(tile, key_dim, value_dim);
  if (problems.empty() && variant.update == ir::Update::delta && 32 * tile.warps / tile.block_v > 32)
    problems.push_back("the delta rule reduces k^T S over the row groups of a column within a warp: 32 * warps / block_v = " +
                       std::to_string(32 * tile.warps / tile.block_v) + " row groups, expected at most 32");
  return problems;
}

std::vector<std::string> validate_tile(const RecurrentTile& tile, std::int64_t key_dim, std::int64_t value_dim) {
  std::vector<std::string> problems = tile_rules(tile);
  if (key_dim > tile.block_k)
    problems.push_back("K = " + std::to_string(key_dim) + " exceeds block_k = " + std::to_string(tile.block_k));
  if (key_dim < 1 || value_dim < 1) problems.push_back("K and V must be at least 1");
  return problems;
}

namespace {

// Emits the fused recurrent kernel part by part: every part reads the variant, the spec
// and what they decide (the flags below), and writes into one Code.
class RecurrentEmitter {
 public:
  RecurrentEmitter(const ir::Variant& variant, const RecurrentKernelSpec& spec, const std::vector<std::string>& id)
      : variant_(variant),
        spec_(spec),
        tile_(spec.tile),
        threads_(32 * spec.tile.warps),
        row_groups_(threads_ / spec.tile.block_v),
        id_(id),
        use_of_(input_use(variant)),
        delta_(variant.update == ir::Update::delta),
        before_(variant.read_before_update),
        l2_(variant.l2_normalize_qk),
        bonus_(variant.has(ir::Slot::bonus)),
        decays_k_(has(ir::Slot::log_decay_k) || has(ir::Slot::log_decay_head)),  // the delta rule: per head, or per key row (KDA)
        decays_v_(has(ir::Slot::log_decay_v)),
        scale_per_token_(varies_over_tokens(ir::Slot::scale)) {}

  RecurrentKernel generate();

 private:
  bool has(ir::Slot s) const { return variant_.has(s); }
  bool varies_over_tokens(ir::Slot s) const { return ir::extent(variant_, variant_.slot(s)).token; }
  std::string render(ir::Slot s, const std::string& suffix) const { return render_slot(variant_, id_, s, suffix); }
  std::string row_load(std::size_t k, const std::string& index) const { return detail::row_load(id_, k, index); }

  std::string header(const RecurrentKernel& kernel) const;
  void constants_and_staging();
  void block_locals();
  void no_feature_slot(ir::Slot s, const std::string& local);
  void state_init();
  void token_locals(const std::string& cpos);
  void stage_key_row();
  void stage_key_side();
  void stage_value_side();
  void l2_normalize();
  void update_tokens();
  void update_delta();
  void update_read_before();
  void update_rows_in_fours(int rows);
  void update_rows();
  void store_outputs();
  void store_final_state();

  const ir::Variant& variant_;
  const RecurrentKernelSpec& spec_;
  const RecurrentTile& tile_;
  const int threads_, row_groups_;
  const std::vector<std::string> id_;
  const InputUse use_of_;
  const bool delta_, before_, l2_, bonus_, decays_k_, decays_v_, scale_per_token_;
  Code c_;
};

std::string RecurrentEmitter::header(const RecurrentKernel& kernel) const {
  const std::string types = types_line(variant_, id_, spec_);
  std::string header = "ladle: fused recurrent kernel " + kernel.name + "\nGenerated by codegen/cuda/recurrent.cpp; do not edit.\n\n";
  header += ir::to_string(variant_);
  header += "\nconfig: " + to_string(tile_) + " (" + std::to_string(threads_) + " threads); requires K <= " +
            std::to_string(tile_.block_k) + "\n";
  header += "launch: grid (ceil(V / " + std::to_string(tile_.block_v) + "), N * H), block (" + std::to_string(threads_) + ")\n";
  header += "types: " + types + "\n";
  header += std::string("reverse=") + (spec_.reverse ? "1" : "0") + " varlen=" + (spec_.varlen ? "1" : "0") +
            " initial_state=" + (spec_.initial_state ? "1" : "0") + " final_state=" + (spec_.final_state ? "1" : "0") + "\n";
  header += "GQA: an input with X heads serves query head h from head h * X / H.\n";
  if (delta_)
    header += "The delta rule: the threads of one value column are adjacent lanes (column = threadIdx.x / ROW_GROUPS),\n"
              "so k^T S is summed over the column's row groups by warp shuffles, once per token.\n";
  return header;
}

// The tile's constants, CHUNK, and the shared staging arrays of CHUNK tokens.
void RecurrentEmitter::constants_and_staging() {
  Code& c = c_;
  c("constexpr int BLOCK_K = " + std::to_string(tile_.block_k) + ", BLOCK_V = " + std::to_string(tile_.block_v) +
    ", THREADS = " + std::to_string(threads_) + ";");
  c("constexpr int ROW_GROUPS = THREADS / BLOCK_V;                     // threads sharing one value column");
  c("constexpr int ROWS = (BLOCK_K + ROW_GROUPS - 1) / ROW_GROUPS;     // state rows each thread keeps");
  if (variant_.normalize)
    c("constexpr int KEY_ROWS = (BLOCK_K + THREADS - 1) / THREADS;       // key-side rows each thread computes");
  c(std::string("constexpr bool REVERSE = ") + (spec_.reverse ? "true" : "false") + ";");
  c("");
  // Tokens are staged CHUNK at a time: every load of a chunk is in flight together, and
  // the block synchronises twice per chunk instead of twice per token. CHUNK is the largest
  // power of two up to 16 whose staging fits in 40 KiB of static shared memory.
  const int smem_per_token = 4 * ((variant_.normalize || bonus_ ? 4 : 3) * tile_.block_k + 2 * tile_.block_v +
                                  row_groups_ * tile_.block_v + 1 + (delta_ ? 1 : 0) + (l2_ ? 2 : 0));
  int chunk = 16;
  while (chunk > 1 && chunk * smem_per_token > 40 * 1024) chunk /= 2;
  c("constexpr int CHUNK = " + std::to_string(chunk) + ";  // tokens staged in shared memory at a time");
  c("");
  c("// The key and value sides of CHUNK tokens, shared by the block.");
  c("alignas(16) __shared__ float q_feature[CHUNK][BLOCK_K];");
  c("alignas(16) __shared__ float k_feature[CHUNK][BLOCK_K];");
  if (decays_k_) c("alignas(16) __shared__ float decay_k[CHUNK][BLOCK_K];");
  c("__shared__ float v_feature[CHUNK][BLOCK_V];");
  if (decays_v_) c("__shared__ float decay_v[CHUNK][BLOCK_V];");
  c("__shared__ float o_partial[CHUNK][ROW_GROUPS][BLOCK_V];");
  if (variant_.normalize) c("__shared__ float q_normaliser[CHUNK][BLOCK_K];");
  if (bonus_) c("alignas(16) __shared__ float bonus_qk[CHUNK][BLOCK_K];  // q_i bonus_i k_i: the current token's read");
  if (delta_) c("__shared__ float token_beta[CHUNK];  // the write strength");
  if (l2_) c("__shared__ float q_inverse_norm[CHUNK], k_inverse_norm[CHUNK];");
  if (scale_per_token_) c("__shared__ float token_scale[CHUNK];");
  c("");
}

// This thread's column and row group, the block's sequence, the inputs' heads and what is computed once.
void RecurrentEmitter::block_locals() {
  Code& c = c_;
  const auto& inputs = variant_.inputs;
  if (delta_)
    c("const int column = threadIdx.x / ROW_GROUPS, group = threadIdx.x % ROW_GROUPS;  // a column's groups: adjacent lanes");
  else
    c("const int column = threadIdx.x % BLOCK_V, group = threadIdx.x / BLOCK_V;");
  c("const int j = blockIdx.x * BLOCK_V + column;  // this thread's value column");
  if (!spec_.initial_state && !spec_.final_state) c("(void)j;");
  c("const int n = blockIdx.y / H, h = blockIdx.y % H;");
  if (spec_.varlen) {
    c("const int b = 0;");
    c("const long long bos = cu_seqlens[n], eos = cu_seqlens[n + 1];");
  } else {
    c("const int b = n;");
    c("const long long bos = 0, eos = T;");
  }
  c("");
  bool any_head_note = false;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!use_of_.used[k] || inputs[k].kind == ir::InputKind::scalar) continue;
    if (!any_head_note) c("// The head of each input that serves query head h.");
    any_head_note = true;
    c("const int " + id_[k] + "_head = h * " + id_[k] + "_heads / H;");
  }
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (use_of_.used[k] && inputs[k].kind == ir::InputKind::head)
      c("const float " + id_[k] + "_value = ladle_load(" + id_[k] + " + b * " + id_[k] + "_stride_b + " + id_[k] + "_head * " +
        id_[k] + "_stride_h);");
  if (!varies_over_tokens(ir::Slot::log_decay_head) && has(ir::Slot::log_decay_head)) no_feature_slot(ir::Slot::log_decay_head, "head_log_decay");
  if (!scale_per_token_) no_feature_slot(ir::Slot::scale, "read_scale");
  c("");
}

// Slots over no features and no tokens are computed once.
void RecurrentEmitter::no_feature_slot(ir::Slot s, const std::string& local) {
  c_("const float " + local + " = " + (has(s) ? render(s, "") : std::string(s == ir::Slot::scale ? "1.0f" : "0.0f")) + ";");
}

void RecurrentEmitter::state_init() {
  Code& c = c_;
  c("// The state tile S[i][j] for this thread's rows i = group * ROWS + r, in registers, fp32.");
  c("float state[ROWS];");
  if (spec_.initial_state) {
    c("LADLE_UNROLL for (int r = 0; r < ROWS; ++r) {");
    c.in();
    c("const int i = group * ROWS + r;");
    c("state[r] = i < K && j < V ? ladle_load(initial_state + ((static_cast<long long>(n) * H + h) * K + i) * V + j) : 0.0f;");
    c.out();
    c("}");
  } else {
    c("LADLE_UNROLL for (int r = 0; r < ROWS; ++r) state[r] = 0.0f;");
  }
  if (variant_.normalize) {
    c("float normaliser[KEY_ROWS];  // n_i for rows i = threadIdx.x + m * THREADS");
    c("for (int m = 0; m < KEY_ROWS; ++m) normaliser[m] = 0.0f;");
  }
}

// The token of chunk position `cpos` and what it reads: row offsets, per-token scalars.
void RecurrentEmitter::token_locals(const std::string& cpos) {
  Code& c = c_;
  c("const long long step = base + " + cpos + ";");
  c("const bool live = step < length;  // past the end: no update, no output");
  c("const long long t = live ? (REVERSE ? eos - 1 - step : bos + step) : bos;");
  token_rows(c, variant_, id_, use_of_.used, false);
  if (varies_over_tokens(ir::Slot::log_decay_head) && has(ir::Slot::log_decay_head)) {
    no_feature_slot(ir::Slot::log_decay_head, "head_log_decay");
    c("(void)head_log_decay;");
  }
}

// One (token, key row) of the chunk: q and k features, the key decay, the bonus read, the normaliser.
void RecurrentEmitter::stage_key_row() {
  Code& c = c_;
  const auto& inputs = variant_.inputs;
  token_locals("cpos");
  c("const bool use = live && in_range;");
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (use_of_.key_side[k] && (inputs[k].kind == ir::InputKind::token_key || inputs[k].kind == ir::InputKind::head_key))
      c("const float " + id_[k] + "_i = use ? " + row_load(k, "i") + " : 0.0f;");
  c("q_feature[cpos][i] = use ? " + render(ir::Slot::q_feature, "_i") + " : 0.0f;");
  c("k_feature[cpos][i] = use ? " + render(ir::Slot::k_feature, "_i") + " : 0.0f;");
  if (decays_k_) {
    std::string log_a = has(ir::Slot::log_decay_k) ? render(ir::Slot::log_decay_k, "_i") : "";
    if (has(ir::Slot::log_decay_head)) log_a = log_a.empty() ? "head_log_decay" : log_a + " + head_log_decay";
    c("decay_k[cpos][i] = use ? expf(" + log_a + ") : 1.0f;");
  }
  if (bonus_) c("bonus_qk[cpos][i] = q_feature[cpos][i] * (use ? " + render(ir::Slot::bonus, "_i") + " : 0.0f) * k_feature[cpos][i];");
  if (variant_.normalize) {
    c("normaliser[m] = normaliser[m]" + std::string(decays_k_ ? " * decay_k[cpos][i]" : "") + " + k_feature[cpos][i];");
    c("q_normaliser[cpos][i] = q_feature[cpos][i] * normaliser[m];");
  }
}

void RecurrentEmitter::stage_key_side() {
  Code& c = c_;
  if (variant_.normalize) {
    // The normaliser is a recurrence over tokens per key row: each thread walks its rows.
    c("for (int m = 0; m < KEY_ROWS; ++m) {");
    c.in();
    c("const int i = threadIdx.x + m * THREADS;");
    c("if (i >= BLOCK_K) break;");
    c("const bool in_range = i < K;");
    c("LADLE_UNROLL for (int cpos = 0; cpos < CHUNK; ++cpos) {");
    c.in();
    stage_key_row();
    c.out();
    c("}");
    c.out();
    c("}");
  } else {
    // Every (token, row) pair of the chunk is independent: spread them over all threads,
    // consecutive threads on consecutive rows (coalesced), all loads in flight at once.
    c("LADLE_UNROLL_4 for (int e = 0; e < (CHUNK * BLOCK_K + THREADS - 1) / THREADS; ++e) {");
    c.in();
    c("const int slot = threadIdx.x + e * THREADS;");
    c("if (slot >= CHUNK * BLOCK_K) break;");
    c("const int cpos = slot / BLOCK_K, i = slot % BLOCK_K;");
    c("const bool in_range = i < K;");
    stage_key_row();
    c.out();
    c("}");
  }
}

void RecurrentEmitter::stage_value_side() {
  Code& c = c_;
  const auto& inputs = variant_.inputs;
  c("LADLE_UNROLL for (int e = 0; e < (CHUNK * BLOCK_V + THREADS - 1) / THREADS; ++e) {");
  c.in();
  c("const int slot = threadIdx.x + e * THREADS;");
  c("if (slot >= CHUNK * BLOCK_V) break;");
  c("const int cpos = slot / BLOCK_V, jv_local = slot % BLOCK_V;");
  token_locals("cpos");
  c("const int jv = blockIdx.x * BLOCK_V + jv_local;");
  c("const bool use = live && jv < V;");
  for (std::size_t k = 0; k < inputs.size(); ++k)
    if (use_of_.value_side[k] && inputs[k].kind == ir::InputKind::token_value)
      c("const float " + id_[k] + "_j = use ? " + row_load(k, "jv") + " : 0.0f;");
  c("v_feature[cpos][jv_local] = use ? " + render(ir::Slot::v, "_j") + " : 0.0f;");
  if (decays_v_) c("decay_v[cpos][jv_local] = use ? expf(" + render(ir::Slot::log_decay_v, "_j") + ") : 1.0f;");
  if (scale_per_token_) {
    c("if (jv_local == 0) token_scale[cpos] = " + render(ir::Slot::scale, "") + ";");
  }
  if (delta_)
    c("if (jv_local == 0) token_beta[cpos] = live ? " + (has(ir::Slot::write_strength) ? render(ir::Slot::write_strength, "") : std::string("1.0f")) +
      " : 0.0f;");
  c.out();
  c("}");
  c("__syncthreads();");
}

void RecurrentEmitter::l2_normalize() {
  Code& c = c_;
  c("// q and k over sqrt(sum over K of x^2 + eps): one warp per token, then the rows rescaled.");
  c("for (int cpos = threadIdx.x / 32; cpos < CHUNK; cpos += THREADS / 32) {");
  c.in();
  c("float qq = 0.0f, kk = 0.0f;");
  c("for (int i = threadIdx.x % 32; i < BLOCK_K; i += 32) qq += q_feature[cpos][i] * q_feature[cpos][i], kk += k_feature[cpos][i] * k_feature[cpos][i];");
  c("LADLE_UNROLL for (int off = 16; off > 0; off >>= 1) qq += __shfl_xor_sync(0xffffffffu, qq, off), kk += __shfl_xor_sync(0xffffffffu, kk, off);");
  c("if (threadIdx.x % 32 == 0) q_inverse_norm[cpos] = 1.0f / sqrtf(qq + " + ir::render_c_literal(ir::l2_normalize_eps) +
    "), k_inverse_norm[cpos] = 1.0f / sqrtf(kk + " + ir::render_c_literal(ir::l2_normalize_eps) + ");");
  c.out();
  c("}");
  c("__syncthreads();");
  c("for (int slot = threadIdx.x; slot < CHUNK * BLOCK_K; slot += THREADS) {");
  c.in();
  c("const int cpos = slot / BLOCK_K, i = slot % BLOCK_K;");
  c("q_feature[cpos][i] *= q_inverse_norm[cpos], k_feature[cpos][i] *= k_inverse_norm[cpos];");
  c.out();
  c("}");
  c("__syncthreads();");
}

void RecurrentEmitter::update_tokens() {
  Code& c = c_;
  c("// 2. Token by token: S = diag(decay_k) S diag(decay_v) + k v^T on this thread's rows,");
  c("//    and their part of q^T S. Positions past the end have k = 0 and decay 1.");
  c("for (int cpos = 0; cpos < CHUNK; ++cpos) {");
  c.in();
  c("const float v_col = v_feature[cpos][column];");
  if (decays_v_) c("const float decay_j = decay_v[cpos][column];");
  c("float o_part = 0.0f;");
  const int rows = (tile_.block_k + row_groups_ - 1) / row_groups_;
  if (delta_) update_delta();
  else if (before_) update_read_before();
  else if (rows % 4 == 0 && rows * row_groups_ == tile_.block_k) update_rows_in_fours(rows);
  else update_rows();
  c("o_partial[cpos][group][column] = o_part;");
  c.out();
  c("}");
  c("__syncthreads();");
}

// S = a S; r = k^T S (over the column's row groups); S += k (beta (v - r)); o = q^T S.
void RecurrentEmitter::update_delta() {
  Code& c = c_;
  c("float kS = 0.0f;");
  const bool per_row = has(ir::Slot::log_decay_k);  // KDA: each key row decays by its own gate
  if (decays_k_ && !per_row) c("const float token_decay = decay_k[cpos][0];  // the head decay, the same on every row");
  c("LADLE_UNROLL for (int r = 0; r < ROWS; ++r) {");
  c.in();
  c("const int i = group * ROWS + r;");
  c("if (i >= BLOCK_K) break;");
  if (decays_k_) c(per_row ? "state[r] *= decay_k[cpos][i];  // diag(exp(log_decay_k + log_decay_head)) S" : "state[r] *= token_decay;");
  c("kS += k_feature[cpos][i] * state[r];");
  c.out();
  c("}");
  c("LADLE_UNROLL for (int off = 1; off < ROW_GROUPS; off <<= 1) kS += __shfl_xor_sync(0xffffffffu, kS, off);");
  c("const float correction = token_beta[cpos] * (v_col - kS);");
  c("LADLE_UNROLL for (int r = 0; r < ROWS; ++r) {");
  c.in();
  c("const int i = group * ROWS + r;");
  c("if (i >= BLOCK_K) break;");
  c("state[r] += k_feature[cpos][i] * correction;");
  c("o_part += q_feature[cpos][i] * state[r];");
  c.out();
  c("}");
}

// o = q^T S_{t-1} (+ (q . diag(bonus) k) v), then S = diag(a) S + k v^T.
void RecurrentEmitter::update_read_before() {
  Code& c = c_;
  c("LADLE_UNROLL for (int r = 0; r < ROWS; ++r) {");
  c.in();
  c("const int i = group * ROWS + r;");
  c("if (i >= BLOCK_K) break;");
  c("o_part += q_feature[cpos][i] * state[r]" + std::string(bonus_ ? " + bonus_qk[cpos][i] * v_col" : "") + ";");
  c("state[r] = state[r]" + std::string(decays_k_ ? " * decay_k[cpos][i]" : "") + " + k_feature[cpos][i] * v_col;");
  c.out();
  c("}");
}

// Rows in fours: one 16-byte shared load per operand for four state rows, and four
// independent partial sums for the read, so its FMA chain is ROWS / 4 long, not ROWS.
void RecurrentEmitter::update_rows_in_fours(int rows) {
  Code& c = c_;
  const bool split_read = rows >= 32;  // shorter rows: the chain is short and ptxas spills
  if (split_read) c("float o_x = 0.0f, o_y = 0.0f, o_z = 0.0f, o_w = 0.0f;");
  c("LADLE_UNROLL for (int r4 = 0; r4 < ROWS / 4; ++r4) {");
  c.in();
  c("const int i = group * ROWS + 4 * r4;");
  c("const ladle_f4 q4 = ladle_ld4(&q_feature[cpos][i]), k4 = ladle_ld4(&k_feature[cpos][i]);");
  if (decays_k_) c("const ladle_f4 a4 = ladle_ld4(&decay_k[cpos][i]);");
  for (const char* lane : {"x", "y", "z", "w"}) {
    const std::string r = std::string("state[4 * r4 + ") + std::to_string(lane[0] == 'w' ? 3 : lane[0] - 'x') + "]";
    std::string decayed = r;
    if (decays_k_) decayed += std::string(" * a4.") + lane;
    if (decays_v_) decayed += " * decay_j";
    c(r + " = " + decayed + " + k4." + lane + " * v_col;");
    c((split_read ? "o_" + std::string(lane) : std::string("o_part")) + " += q4." + std::string(lane) + " * " + r + ";");
  }
  c.out();
  c("}");
  if (split_read) c("o_part = (o_x + o_y) + (o_z + o_w);");
}

void RecurrentEmitter::update_rows() {
  Code& c = c_;
  c("LADLE_UNROLL for (int r = 0; r < ROWS; ++r) {");
  c.in();
  c("const int i = group * ROWS + r;");
  c("if (i >= BLOCK_K) break;");
  std::string decayed = "state[r]";
  if (decays_k_) decayed += " * decay_k[cpos][i]";
  if (decays_v_) decayed += " * decay_j";
  c("state[r] = " + decayed + " + k_feature[cpos][i] * v_col;");
  c("o_part += q_feature[cpos][i] * state[r];");
  c.out();
  c("}");
}

void RecurrentEmitter::store_outputs() {
  Code& c = c_;
  c("// 3. Sum the row groups, scale, store o for the chunk's live tokens.");
  c("for (int slot = threadIdx.x; slot < CHUNK * BLOCK_V; slot += THREADS) {");
  c.in();
  c("const int cpos = slot / BLOCK_V, col = slot % BLOCK_V;");
  c("const int jo = blockIdx.x * BLOCK_V + col;");
  c("const long long step = base + cpos;");
  c("if (step >= length || jo >= V) continue;");
  c("const long long t = REVERSE ? eos - 1 - step : bos + step;");
  c("float o_sum = 0.0f;");
  c("for (int rg = 0; rg < ROW_GROUPS; ++rg) o_sum += o_partial[cpos][rg][col];");
  const std::string scale_expr = scale_per_token_ ? "token_scale[cpos]" : "read_scale";
  if (variant_.normalize) {
    c("float z = 0.0f;  // q^T n");
    c("for (int i = 0; i < BLOCK_K; ++i) z += q_normaliser[cpos][i];");
    c("o_sum = " + scale_expr + " * o_sum / (" + scale_expr + " * z + " + ir::render_c_literal(variant_.normalize_eps) + ");");
  } else {
    c("o_sum *= " + scale_expr + ";");
  }
  c("ladle_store(o + b * o_stride_b + t * o_stride_t + h * o_stride_h + jo * o_stride_d, o_sum);");
  c.out();
  c("}");
  c("__syncthreads();  // the next chunk overwrites the staging arrays");
}

void RecurrentEmitter::store_final_state() {
  Code& c = c_;
  c("");
  c("LADLE_UNROLL for (int r = 0; r < ROWS; ++r) {");
  c.in();
  c("const int i = group * ROWS + r;");
  c("if (i < K && j < V) final_state[((static_cast<long long>(n) * H + h) * K + i) * V + j] = state[r];");
  c.out();
  c("}");
}

RecurrentKernel RecurrentEmitter::generate() {
  // Kernel name: the variant's hash and everything the spec changes in the source.
  const std::string spec_key = to_string(tile_) + types_key(spec_);
  RecurrentKernel kernel;
  kernel.name = "ladle_recurrent_" + hex(fnv1a(spec_key, ir::hash(variant_)));
  kernel.threads = static_cast<unsigned>(threads_);
  kernel.block_v = tile_.block_v;

  std::vector<std::string> declarations;
  declare_params(variant_, id_, spec_, declarations, kernel.params);

  Code& c = c_;
  c(comment_block(header(kernel)) + "\n" + storage_helpers);
  c("extern \"C\" __global__ void __launch_bounds__(" + std::to_string(threads_) + ") " + kernel.name + "(");
  c.in(), c.in();
  for (std::size_t p = 0; p < declarations.size(); ++p) c(declarations[p] + (p + 1 < declarations.size() ? "," : ") {"));
  c.out();
  constants_and_staging();
  block_locals();
  state_init();
  c("");
  c("const long long length = eos - bos;");
  c("for (long long base = 0; base < length; base += CHUNK) {");
  c.in();
  c("// 1. Stage the chunk: the key side (q, k features and decay over i; each thread walks");
  c("//    its rows through the chunk in order) and the value side (v, decay over j).");
  stage_key_side();
  stage_value_side();
  if (l2_) l2_normalize();
  c("");
  update_tokens();
  c("");
  store_outputs();
  c.out();
  c("}");
  if (spec_.final_state) store_final_state();
  c.out();
  c("}");
  kernel.source = c.text();
  return kernel;
}

}  // namespace

RecurrentKernel generate_recurrent(const ir::Variant& variant, const RecurrentKernelSpec& spec) {
  const auto fail = [](const std::string& what) { throw InvalidArgument("generate_recurrent: " + what); };
  if (const auto problems = ir::validate(variant); !problems.empty()) fail("malformed variant: " + problems.front());
  if (const auto problems = tile_rules(spec.tile); !problems.empty()) fail("tile " + to_string(spec.tile) + ": " + problems.front());
  check_types("generate_recurrent", variant, spec);
  if (variant.update == ir::Update::delta && 32 * spec.tile.warps / spec.tile.block_v > 32)
    fail("tile " + to_string(spec.tile) + ": the delta rule needs at most 32 row groups (32 * warps / block_v)");
  return detail::with_input_names<RecurrentKernel>(
      variant.inputs, [&](const std::vector<std::string>& id) { return RecurrentEmitter(variant, spec, id).generate(); });
}

}  // namespace ladle::cuda
