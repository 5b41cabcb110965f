// The emitter of the chunked delta rule's three kernels (prepare, states, outputs), shared by
// codegen/cuda/chunked_delta.cpp (the kernel's frame and the parts every phase uses) and
// codegen/cuda/detail/chunked_delta_phases.cpp (each phase's steps). Internal to codegen (not installed).
#pragma once

#include <string>
#include <vector>

#include <ladle/dsl/ir.h>

#include "../chunked_delta.h"
#include "cuda_source.h"

namespace ladle::cuda::detail {

// Emits one phase's kernel of the chunked delta rule part by part. Its members are what every
// part reads (the variant, the spec, the tile's constants, the identifiers) and the Code they
// write into; the methods are named for what they emit.
struct ChunkedDeltaEmitter {
  ChunkedDeltaEmitter(const ir::Variant& variant, const ChunkedDeltaSpec& spec, const std::vector<std::string>& id);

  ChunkedDeltaKernel generate();

  bool has(ir::Slot s) const { return variant.has(s); }
  std::string render(ir::Slot s, const std::string& suffix) const { return render_slot(variant, id, s, suffix); }
  std::string row_load(std::size_t k, const std::string& index) const { return detail::row_load(id, k, index); }

  // The kernel's frame.
  void extra(const std::string& c_type, const std::string& name, KernelParam::Type type, KernelParam::Role role);
  void declare_parameters();
  int shared_bytes() const;
  std::string header(const char* phase_name) const;
  void constants();
  void sequence_and_chunk();

  // The parts every phase uses.
  void stage_tile(ir::Slot slot, const std::string& tile, const std::string& ld, const std::string& width,
                  const std::string& limit, const std::string& suffix, ir::Role role, bool normalize = false,
                  const std::string& prefetched = "");
  void token_of_row(const std::string& chunk_expr);
  void prefetch_rows(ir::Role role, const std::string& name, const std::string& width, const std::string& limit);
  void mma_rows(const std::string& acc, const std::string& a_tile, const std::string& a_ld, const std::string& a_row0,
                const std::string& b_tile, const std::string& b_ld, bool b_trans, const std::string& ksteps,
                const std::string& ntiles, const std::string& b_col0 = "0");
  void zero(const std::string& acc, const std::string& ntiles);

  // prepare: gamma, A, T = (I + A)^-1, W and U.
  bool prepare_stage();
  void prepare_gamma();
  void prepare_a();
  void prepare_inverse();
  void prepare_w_u(bool prefetch_v);
  // states: h and E per chunk, the state carried over the chunks.
  void states_tiles_and_state();
  void states_fetch();
  void states_chunks();
  void states_e();
  void states_update();
  void states_final();
  // outputs: o = scale (exp(gamma) q h + P E).
  void outputs_loads();
  void outputs_fetch_h_e(const std::string& group_count);
  void outputs_scores();
  void outputs_values();
  // KDA: the gates' tile G (per-feature cumulative log2 decay), the scores with per-feature references.
  void kda_stage_gates(const std::string& tile);
  void kda_scan_gates(const std::string& tile);
  void kda_scores(const std::string& x, const std::string& y, bool inclusive);
  void kda_scale_rows(const std::string& tile);
  void outputs_loads_kda();

  const ir::Variant& variant;
  const ChunkedDeltaSpec& spec;
  const bool prepare, kda, states;
  const int C = chunked_delta_chunk, BK;
  const std::vector<std::string> id;
  const std::vector<ir::Input>& inputs;
  const InputUse use_of;
  // The outputs kernel covers 128 value columns a block where V allows (eight warps: q and k
  // staged once for both halves), else 64 (four warps).
  const int groups;
  // Shared memory (bf16 tiles padded by 8 elements a row, so that ldmatrix's 8 rows hit 8 bank groups).
  const int KLD, VLD = 72, ALD = C + 4, TLD = C + 8, PVLD, GLD = BK + 8;
  ChunkedDeltaKernel kernel;
  std::vector<std::string> declarations;
  Code c;
};

}  // namespace ladle::cuda::detail
