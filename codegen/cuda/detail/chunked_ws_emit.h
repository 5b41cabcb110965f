// The ws kernel's writer, shared by the files of generate_ws_chunked (internal to codegen, not
// installed): the values every part of the kernel reads (WsContext) and one method per part of
// the kernel it emits (WsEmitter), so that each form (per-head decay, key-side gate, value-side
// gate, state pass) reads as the sequence of its parts. The ring of stages has its own file
// (chunked_ws_ring.cpp): it is to become a device header shared with the other Hopper kernels.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "chunked_ws.h"
#include "cuda_source.h"

namespace ladle::cuda::detail {

constexpr int ws_chunk = 64;
constexpr int ws_producer_registers = 24, ws_consumer_registers = 240;

// What every part of the kernel reads, fixed before the first line is written.
struct WsContext {
  const ir::Variant& variant;
  const ChunkedKernelSpec& spec;
  const std::vector<ir::Input>& inputs;
  bool states;     // the segmented form's state pass (k and v only, the update alone)
  bool segmented;  // one segment of a sequence, entering with its earlier segments folded in
  // A key-side gate (GLA): its per-token inputs come by TMA beside k. The state pass forms
  // kup = k 2^(G_C - G_s) per key feature instead of vup; the serial kernel (kserial) forms q~ and k~
  // against a reference per key feature (see chunked_ws.h).
  bool kgate, kserial;
  // A read before the update (kserial only): q~ carries G_(t-1), the scores are strictly causal, the bonus
  // on their diagonal; a single-token step reads the state as it entered (q~ against G_(t0-1)).
  bool before_read, bonus;
  // A value-side gate (vserial): its per-token inputs come by TMA beside v, one box per consumer.
  bool vgate;
  bool has_gate;                // a per-head decay
  std::vector<int> gate_boxes;  // the per-token inputs of the gate copied by TMA (ws_gate_inputs)
  int GB;                       // their number
  int C, BK, BV, CONSUMERS, STAGES, THREADS;
  std::vector<std::string> id;
  InputUse use_of;
  int qi, ki, vi;  // the inputs q, k and v read as they are (qi: -1 in the state pass)
  // The per-token head inputs the per-head decay reads (loaded one chunk ahead into registers).
  std::vector<bool> gate_reads;
  std::string sequence_index;  // the sequence's row of initial_state and final_state
};

// Writes the kernel's parts into `c`, each method one part (the numbers are those of the comments the
// kernel carries: 1. the producer, 2a, 2b, ... the consumers' steps per chunk).
class WsEmitter : private WsContext {
 public:
  WsEmitter(const WsContext& context, Code& code) : WsContext(context), c(code) {}

  // chunked_ws_parts.cpp: the constants, the shared memory layout, the block's sequence and the
  // consumers' setup, the state as it enters, and the pieces every form's chunk uses.
  void constants() const;
  void shared_layout() const;
  void sequence() const;
  void consumer_setup() const;
  void entering_state() const;
  void descriptors() const;
  void state_stores() const;

  // chunked_ws_ring.cpp: the ring of stages (mbarriers full / empty, the producer's copies, phase parity).
  void ring_init() const;
  void producer() const;
  void chunk_loop_head() const;
  void store_chunk_state() const;
  void stage_wait() const;
  void stage_release(bool with_comment) const;

  // chunked_ws_decay.cpp: a per-head decay or none (the serial kernel and the state pass).
  void decay_chunks() const;
  // chunked_ws_kserial.cpp: a key-side gate's serial kernel.
  void kserial_chunks() const;
  // chunked_ws_vserial.cpp: a value-side gate's serial kernel.
  void vserial_chunks() const;

 private:
  // chunked_ws_parts.cpp
  void fit_words_init() const;
  void producer_copies() const;
  void for_state(const std::function<void()>& body) const;
  void fold_earlier_segments() const;
  void store_o() const;
  void batch(const std::string& update) const;
  void p_fragments(const std::string& value) const;
  void gate_value_at(const std::string& row, const std::string& col, const std::function<std::string(int)>& box) const;
  void key_gate_at(const std::string& row) const;
  void value_gate_at(const std::string& row, const std::string& col) const;

  // chunked_ws_decay.cpp
  void decay_gate_scan() const;
  void load_next_gates(const std::string& chunk) const;
  void decay_update_operands() const;
  void key_gate_kup() const;
  void state_pass_update() const;
  void decay_products() const;

  // chunked_ws_kserial.cpp
  void kserial_setup() const;
  void kserial_bonus_read() const;
  void kserial_gate_sums() const;
  void kserial_steps() const;
  void kserial_window_reference() const;
  void kserial_step(bool recompute) const;
  void kserial_step_operands(bool recompute) const;
  void kserial_step_state() const;
  void kserial_step_products() const;

  // chunked_ws_vserial.cpp
  void vserial_gate_sums() const;
  void vserial_operands() const;
  void vserial_fitting_outputs() const;
  void vserial_exact_outputs() const;
  void vserial_final_state() const;

  Code& c;
};

}  // namespace ladle::cuda::detail
