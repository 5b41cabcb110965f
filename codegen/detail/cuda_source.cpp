#include "cuda_source.h"

#include <cctype>
#include <map>
#include <sstream>

#include <ladle/runtime/error.h>

#include "../render_c.h"

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

// Identifiers the kernel template uses; an input whose name (or a name derived from it)
// would clash with one of these, or with C++, is renamed.
const std::set<std::string>& cpp_words() {
  static const std::set<std::string> names = {
      // the template's own (fused recurrent)
      "BLOCK_K", "BLOCK_V", "THREADS", "ROW_GROUPS", "ROWS", "KEY_ROWS", "REVERSE", "q_feature", "k_feature",
      "decay_k", "v_feature", "decay_v", "o_partial", "q_normaliser", "column", "group", "j", "jv", "n", "h", "b",
      "bos", "eos", "state", "normaliser", "step", "t", "i", "m", "r", "c", "o_part", "o_sum", "z", "read_scale",
      "head_log_decay", "o", "o_stride_b", "o_stride_t", "o_stride_h", "o_stride_d", "initial_state", "final_state",
      "cu_seqlens", "B", "T", "H", "K", "V", "rg", "in_range", "jv_local",
      // ... and its update forms' (the delta rule, the bonus read, L2 normalisation)
      "kS", "correction", "token_decay", "token_beta", "bonus_qk", "q_inverse_norm", "k_inverse_norm", "qq", "kk", "off",
      // C++ words a name could plausibly be
      "auto", "bool", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
      "extern", "float", "for", "goto", "if", "inline", "int", "long", "new", "delete", "register", "return",
      "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void",
      "volatile", "while", "class", "namespace", "template", "this", "true", "false", "private", "public",
      "operator", "asm", "export", "final", "override", "try", "catch", "throw", "using", "virtual", "friend",
      "mutable", "explicit", "typename", "constexpr", "nullptr", "threadIdx", "blockIdx", "blockDim", "gridDim",
      "warpSize"};
  return names;
}

// One C identifier per input: its name where that is safe and readable, else in<i>_<name>.
std::vector<std::string> identifiers(const ir::Variant& variant, const std::set<std::string>& reserved) {
  const auto sanitize = [](const std::string& name) {
    std::string id;
    for (char c : name) id += std::isalnum(static_cast<unsigned char>(c)) || c == '_' ? c : '_';
    if (id.empty() || std::isdigit(static_cast<unsigned char>(id[0]))) id = "_" + id;
    return id;
  };
  const auto derived = [](const std::string& id) {
    return std::vector<std::string>{id,           id + "_row",      id + "_head",     id + "_value",    id + "_heads",
                                    id + "_i",    id + "_j",        id + "_x8",       id + "_raw",        id + "_base",     id + "_vec",      id + "_t",        id + "_stride_b", id + "_stride_t", id + "_stride_h",
                                    id + "_stride_d"};
  };
  std::vector<std::string> ids;
  for (const ir::Input& in : variant.inputs) ids.push_back(sanitize(in.name));
  // An input keeps its own name unless a name derived from it is taken (by the template or
  // another input) or looks like a renamed one.
  std::map<std::string, int> uses;
  for (const std::string& id : ids)
    for (const std::string& name : derived(id)) ++uses[name];
  for (std::size_t i = 0; i < ids.size(); ++i) {
    bool clash = ids[i].rfind("ladle_", 0) == 0 ||
                 (ids[i].rfind("in", 0) == 0 && ids[i].size() > 2 && std::isdigit(static_cast<unsigned char>(ids[i][2])));
    for (const std::string& name : derived(ids[i])) clash = clash || uses[name] > 1 || (reserved.count(name) > 0 || cpp_words().count(name) > 0);
    if (clash) ids[i] = "in" + std::to_string(i) + "_" + ids[i];
  }
  return ids;
}


// Host-independent helpers every kernel of the family uses: 16-bit storage types without
// cuda_fp16.h (so NVRTC needs no include path) and typed loads/stores through float.
const char* const storage_helpers = R"(#ifndef LADLE_UNROLL
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define LADLE_UNROLL _Pragma("unroll")
#define LADLE_UNROLL_1 _Pragma("unroll 1")
#define LADLE_UNROLL_2 _Pragma("unroll 2")
#define LADLE_UNROLL_4 _Pragma("unroll 4")
#define LADLE_UNROLL_8 _Pragma("unroll 8")
#else
#define LADLE_UNROLL
#define LADLE_UNROLL_1
#define LADLE_UNROLL_2
#define LADLE_UNROLL_4
#define LADLE_UNROLL_8
#endif
#endif
#ifndef LADLE_VECTOR4
#define LADLE_VECTOR4
// Four consecutive state rows' operands in one 16-byte shared-memory load.
struct alignas(16) ladle_f4 { float x, y, z, w; };
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__device__ __forceinline__ ladle_f4 ladle_ld4(const float* p) { return *reinterpret_cast<const ladle_f4*>(p); }
__device__ __forceinline__ void ladle_st4(float* p, ladle_f4 v) { *reinterpret_cast<ladle_f4*>(p) = v; }
#else
inline ladle_f4 ladle_ld4(const float* p) { return ladle_f4{p[0], p[1], p[2], p[3]}; }
inline void ladle_st4(float* p, ladle_f4 v) { p[0] = v.x, p[1] = v.y, p[2] = v.z, p[3] = v.w; }
#endif
#endif
#ifndef LADLE_RECURRENT_HELPERS
#define LADLE_RECURRENT_HELPERS
struct ladle_f16 { unsigned short bits; };   // IEEE binary16
struct ladle_bf16 { unsigned short bits; };  // bfloat16

__device__ __forceinline__ float ladle_load(const float* p) { return *p; }
__device__ __forceinline__ float ladle_load(const ladle_bf16* p) { return __uint_as_float(static_cast<unsigned>(p->bits) << 16); }
__device__ __forceinline__ float ladle_load(const ladle_f16* p) {
  float value;
  asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(p->bits));
  return value;
}
__device__ __forceinline__ void ladle_store(float* p, float value) { *p = value; }
__device__ __forceinline__ void ladle_store(ladle_f16* p, float value) {
  unsigned short bits;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));
  p->bits = bits;
}
__device__ __forceinline__ void ladle_store(ladle_bf16* p, float value) {
  const unsigned x = __float_as_uint(value);  // round to nearest even; NaN stays quiet
  p->bits = (x & 0x7fffffffu) > 0x7f800000u ? static_cast<unsigned short>((x >> 16) | 0x40u)
                                              : static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
#endif  // LADLE_RECURRENT_HELPERS
)";

const char* const tensor_core_helpers = R"(#ifndef LADLE_CHUNKED_HELPERS
#define LADLE_CHUNKED_HELPERS
#define LADLE_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
// 2^x on the special function unit (ex2.approx: 2 ulp); x is a difference of log2 gates.
__device__ __forceinline__ float ladle_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ unsigned ladle_float_bits(float x) { return __float_as_uint(x); }
__device__ __forceinline__ float ladle_bits_float(unsigned x) { return __uint_as_float(x); }
__device__ __forceinline__ float ladle_bf16_float(unsigned short bits) { return __uint_as_float(static_cast<unsigned>(bits) << 16); }
__device__ __forceinline__ unsigned short ladle_bf16_bits(float value) {
  const unsigned x = __float_as_uint(value);  // round to nearest even; NaN stays quiet
  return (x & 0x7fffffffu) > 0x7f800000u ? static_cast<unsigned short>((x >> 16) | 0x40u)
                                           : static_cast<unsigned short>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
// Two floats to a bf16 pair (lo in the low half) in one instruction, rounding to nearest even.
__device__ __forceinline__ unsigned ladle_pack_bf16(float lo, float hi) {
  unsigned pair;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(hi), "f"(lo));
  return pair;
}
__device__ __forceinline__ unsigned ladle_shared_address(const void* p) {
  unsigned address;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(address) : "l"(p));
  return address;
}
// Four 8x8 bf16 matrices from shared memory; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ladle_ldmatrix_x4(unsigned (&r)[4], const unsigned short* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ladle_shared_address(p)));
}
__device__ __forceinline__ void ladle_ldmatrix_x4_trans(unsigned (&r)[4], const unsigned short* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(ladle_shared_address(p)));
}
// The same from a 32-bit shared-memory address (ladle_shared_address of the row's element).
__device__ __forceinline__ void ladle_ldmatrix_x4_at(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
__device__ __forceinline__ void ladle_ldmatrix_x4_trans_at(unsigned (&r)[4], unsigned address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
// d += a (16x16, row) * b (16x8, col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void ladle_mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif  // LADLE_CHUNKED_HELPERS
#ifndef LADLE_CP_ASYNC_HELPERS
#define LADLE_CP_ASYNC_HELPERS
// 16 bytes global -> shared without passing through registers; complete after the wait.
__device__ __forceinline__ void ladle_cp_async_16(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ladle_shared_address(shared)), "l"(global));
}
__device__ __forceinline__ void ladle_cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int Pending>
__device__ __forceinline__ void ladle_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(Pending)); }
#endif  // LADLE_CP_ASYNC_HELPERS
#ifndef LADLE_VECTOR8_HELPERS
#define LADLE_VECTOR8_HELPERS
// Eight consecutive values in one 16-byte access: a staged row's features from global memory
// (where the row is contiguous and aligned) and the shared-memory passes over staged rows.
// One address and one access per eight values instead of eight (the profile of the serial
// form: 41 % of its instructions were the per-element index arithmetic of the staging).
struct alignas(16) ladle_u4 { unsigned x, y, z, w; };
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
__device__ __forceinline__ ladle_u4 ladle_ld16(const void* p) { return *reinterpret_cast<const ladle_u4*>(p); }
__device__ __forceinline__ void ladle_st16(void* p, ladle_u4 value) { *reinterpret_cast<ladle_u4*>(p) = value; }
#else
inline ladle_u4 ladle_ld16(const void* p) { ladle_u4 value; std::memcpy(&value, p, 16); return value; }
inline void ladle_st16(void* p, ladle_u4 value) { std::memcpy(p, &value, 16); }
#endif
// A bf16 pair (an mma fragment register) times two factors, rounded back to a bf16 pair.
__device__ __forceinline__ unsigned ladle_scale_bf16x2(unsigned pair, float lo, float hi) {
  return ladle_pack_bf16(ladle_bits_float(pair << 16) * lo, ladle_bits_float(pair & 0xffff0000u) * hi);
}
__device__ __forceinline__ bool ladle_row_vector(const void* p, long long stride, int count) {
  return stride == 1 && count >= 8 && (reinterpret_cast<unsigned long long>(p) & 15ull) == 0;
}
__device__ __forceinline__ void ladle_unpack8_bf16(float (&x)[8], ladle_u4 w) {
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  LADLE_UNROLL for (int u = 0; u < 4; ++u) {
    x[2 * u] = ladle_bf16_float(static_cast<unsigned short>(words[u] & 0xffffu));
    x[2 * u + 1] = ladle_bf16_float(static_cast<unsigned short>(words[u] >> 16));
  }
}
__device__ __forceinline__ void ladle_unpack8_f16(float (&x)[8], ladle_u4 w) {
  const unsigned words[4] = {w.x, w.y, w.z, w.w};
  LADLE_UNROLL for (int u = 0; u < 4; ++u) {
    const ladle_f16 lo{static_cast<unsigned short>(words[u] & 0xffffu)}, hi{static_cast<unsigned short>(words[u] >> 16)};
    x[2 * u] = ladle_load(&lo);
    x[2 * u + 1] = ladle_load(&hi);
  }
}
// x[u] = p[u * stride] for u < count; p[0] past count (the caller masks those), so that no
// load sits in a branch of its own.
__device__ __forceinline__ void ladle_load8(float (&x)[8], const ladle_bf16* p, long long stride, int count) {
  if (ladle_row_vector(p, stride, count)) {
    ladle_unpack8_bf16(x, ladle_ld16(p));
  } else {
    LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] = ladle_load(p + (u < count ? u * stride : 0));
  }
}
__device__ __forceinline__ void ladle_load8(float (&x)[8], const ladle_f16* p, long long stride, int count) {
  if (ladle_row_vector(p, stride, count)) {
    ladle_unpack8_f16(x, ladle_ld16(p));
  } else {
    LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] = ladle_load(p + (u < count ? u * stride : 0));
  }
}
__device__ __forceinline__ void ladle_load8(float (&x)[8], const float* p, long long stride, int count) {
  if (ladle_row_vector(p, stride, count)) {
    const ladle_f4 a = ladle_ld4(p), b = ladle_ld4(p + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  } else {
    LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] = ladle_load(p + (u < count ? u * stride : 0));
  }
}
// Eight raw 16-bit values of a prefetch buffer in shared memory (16-byte aligned by
// construction: no alignment test, one 16-byte load).
__device__ __forceinline__ void ladle_load8_raw(float (&x)[8], const ladle_bf16* s) { ladle_unpack8_bf16(x, ladle_ld16(s)); }
__device__ __forceinline__ void ladle_load8_raw(float (&x)[8], const ladle_f16* s) { ladle_unpack8_f16(x, ladle_ld16(s)); }
// Two adjacent values of a [K][V] state in global memory: one 4-byte (bf16) or 8-byte (fp32)
// store where both are inside the row and the pair is aligned, else one store each.
__device__ __forceinline__ void ladle_store2(ladle_bf16* p, float a, float b, bool second) {
  if (second && (reinterpret_cast<unsigned long long>(p) & 3ull) == 0) {
    *reinterpret_cast<unsigned*>(p) = ladle_pack_bf16(a, b);
  } else {
    ladle_store(p, a);
    if (second) ladle_store(p + 1, b);
  }
}
__device__ __forceinline__ void ladle_store2(ladle_f16* p, float a, float b, bool second) {
  if (second && (reinterpret_cast<unsigned long long>(p) & 3ull) == 0) {
    ladle_f16 pair[2];  // rounded as ladle_store rounds, then one 4-byte store
    ladle_store(&pair[0], a);
    ladle_store(&pair[1], b);
    *reinterpret_cast<unsigned*>(p) = static_cast<unsigned>(pair[0].bits) | (static_cast<unsigned>(pair[1].bits) << 16);
  } else {
    ladle_store(p, a);
    if (second) ladle_store(p + 1, b);
  }
}
struct alignas(8) ladle_f2 { float x, y; };
__device__ __forceinline__ void ladle_store2(float* p, float a, float b, bool second) {
  if (second && (reinterpret_cast<unsigned long long>(p) & 7ull) == 0) {
    *reinterpret_cast<ladle_f2*>(p) = ladle_f2{a, b};
  } else {
    *p = a;
    if (second) p[1] = b;
  }
}
// Two adjacent values in one 4-byte (16-bit) or 8-byte (fp32) store, where the caller has checked
// that the pair is aligned and inside the row.
__device__ __forceinline__ void ladle_store_pair(ladle_bf16* p, float a, float b) { *reinterpret_cast<unsigned*>(p) = ladle_pack_bf16(a, b); }
__device__ __forceinline__ void ladle_store_pair(ladle_f16* p, float a, float b) {
  ladle_f16 pair[2];
  ladle_store(&pair[0], a);
  ladle_store(&pair[1], b);
  *reinterpret_cast<unsigned*>(p) = static_cast<unsigned>(pair[0].bits) | (static_cast<unsigned>(pair[1].bits) << 16);
}
__device__ __forceinline__ void ladle_store_pair(float* p, float a, float b) { *reinterpret_cast<ladle_f2*>(p) = ladle_f2{a, b}; }
// The next chunk's raw 16-bit row segment into shared memory: one cp.async where the row is
// contiguous and aligned, else plain copies; nothing where the segment is outside the tensor
// (count <= 0: the staging masks it).
template <typename T16>
__device__ __forceinline__ void ladle_prefetch8(T16* raw, const T16* p, long long stride, int count) {
  if (count <= 0) return;
  if (ladle_row_vector(p, stride, count)) {
    ladle_cp_async_16(raw, p);
  } else {
    LADLE_UNROLL for (int u = 0; u < 8; ++u) raw[u] = p[u < count ? u * stride : 0];
  }
}
// Staged rows in shared memory (16-byte aligned): eight bf16 or eight fp32 values.
__device__ __forceinline__ void ladle_load8_bf16(float (&x)[8], const unsigned short* s) { ladle_unpack8_bf16(x, ladle_ld16(s)); }
__device__ __forceinline__ void ladle_store8_bf16(unsigned short* s, const float (&x)[8]) {
  ladle_st16(s, ladle_u4{ladle_pack_bf16(x[0], x[1]), ladle_pack_bf16(x[2], x[3]), ladle_pack_bf16(x[4], x[5]),
                         ladle_pack_bf16(x[6], x[7])});
}
__device__ __forceinline__ void ladle_load8_f32(float (&x)[8], const float* s) {
  const ladle_u4 a = ladle_ld16(s), b = ladle_ld16(s + 4);
  const unsigned words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  LADLE_UNROLL for (int u = 0; u < 8; ++u) x[u] = ladle_bits_float(words[u]);
}
__device__ __forceinline__ void ladle_store8_f32(float* s, const float (&x)[8]) {
  ladle_st16(s, ladle_u4{ladle_float_bits(x[0]), ladle_float_bits(x[1]), ladle_float_bits(x[2]), ladle_float_bits(x[3])});
  ladle_st16(s + 4, ladle_u4{ladle_float_bits(x[4]), ladle_float_bits(x[5]), ladle_float_bits(x[6]), ladle_float_bits(x[7])});
}
#endif  // LADLE_VECTOR8_HELPERS
)";

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
