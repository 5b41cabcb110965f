// ladle's Hopper pipeline parts (sm_90a): the TMA tensor map, mbarriers (init, arrive, expect_tx,
// parity wait), named barriers, TMA box loads, setmaxnreg and 128-byte-swizzled wgmma descriptors.
// Needs tensor_core.cuh and wgmma.cuh first.
#ifndef LADLE_TENSOR_MAP_DEFINED
#define LADLE_TENSOR_MAP_DEFINED
// A TMA tensor map as the driver encodes it (CUtensorMap: 128 opaque bytes, 64-byte aligned).
struct alignas(64) ladle_tensor_map {
  unsigned long long opaque[16];
};
#endif
#ifndef LADLE_PIPELINE_HELPERS
#define LADLE_PIPELINE_HELPERS
// mbarriers in shared memory (PTX ISA 9.7.13.15): a phase completes when its expected arrivals
// have arrived and the bytes announced by expect_tx have landed.
__device__ __forceinline__ void ladle_mbarrier_init(unsigned long long* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(ladle_shared_address(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (the TMA unit) before first use.
__device__ __forceinline__ void ladle_fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void ladle_mbarrier_arrive(unsigned long long* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(ladle_shared_address(bar)) : "memory");
}
// One arrival that also announces `bytes` of copies to come.
__device__ __forceinline__ void ladle_mbarrier_arrive_expect_tx(unsigned long long* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(ladle_shared_address(bar)), "r"(bytes) : "memory");
}
// Named barriers (1..15; 0 is __syncthreads'): bar.sync waits for `threads` arrivals in all,
// bar.arrive adds this warp's and goes on.
__device__ __forceinline__ void ladle_named_barrier_sync(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void ladle_named_barrier_arrive(unsigned id, unsigned threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Returns once the phase of this parity has completed.
__device__ __forceinline__ void ladle_mbarrier_wait(unsigned long long* bar, unsigned parity) {
  const unsigned address = ladle_shared_address(bar);
  unsigned done = 0;
  do {
    // The suspend-time hint (ns) lets the thread sleep until the phase completes instead of
    // polling: the producer, whose ring is mostly full, otherwise spends issue slots spinning.
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(address), "r"(parity), "r"(10000000u)
                 : "memory");
  } while (!done);
}
// A box of a tensor into shared memory by TMA; the bytes complete a transaction on bar.
__device__ __forceinline__ void ladle_tma_load_4d(void* dst, const ladle_tensor_map* map, int c0, int c1, int c2, int c3,
                                                  unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(
          ladle_shared_address(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(ladle_shared_address(bar))
      : "memory");
}
// Registers per thread of this warpgroup: given back by the producer, taken by the consumers.
template <int N>
__device__ __forceinline__ void ladle_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void ladle_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }
#endif  // LADLE_PIPELINE_HELPERS
#ifndef LADLE_WGMMA_SW128
#define LADLE_WGMMA_SW128
// A wgmma matrix descriptor of a 128-byte-swizzled operand (swizzle mode 1, bits 62-63).
__device__ __forceinline__ unsigned long long ladle_wgmma_desc_sw128(const void* p, unsigned leading_bytes, unsigned stride_bytes) {
  return ladle_wgmma_desc(p, leading_bytes, stride_bytes) | (1ull << 62);
}
#endif
#ifndef LADLE_STAGE_RING
#define LADLE_STAGE_RING
// The stage ring of the warp-specialised kernels, written once: one producer thread fills STAGES
// slots of shared memory by TMA, the consumer warps read them, round after round. Each slot has
// a `full` mbarrier (the producer's arrive_expect_tx, then the copies' bytes complete its phase)
// and an `empty` one (lane 0 of every consumer warp arrives when its warp is done with the slot).
// Round r uses slot r % STAGES in phase r / STAGES, so the phase parity a waiter passes is
// (r / STAGES) & 1; the producer waits for the release of the same slot one pass earlier.
template <int STAGES>
struct ladle_stage_ring {
  unsigned long long* full;   // [STAGES]
  unsigned long long* empty;  // [STAGES]

  // One thread, before the block-wide barrier that publishes the ring.
  __device__ __forceinline__ void init(unsigned consumer_warps) const {
    for (int s = 0; s < STAGES; ++s) {
      ladle_mbarrier_init(&full[s], 1);                 // the producer's arrive_expect_tx
      ladle_mbarrier_init(&empty[s], consumer_warps);   // lane 0 of every consumer warp
    }
  }
  __device__ __forceinline__ static int slot(int round) { return round % STAGES; }
  // The producer, before round `round`'s copies: waits until its slot is free, announces `bytes`
  // and returns the barrier the copies complete.
  __device__ __forceinline__ unsigned long long* acquire(int round, unsigned bytes) const {
    wait_free(round);
    return announce(round, bytes);
  }
  // acquire's two halves, for a producer that writes something of its own into the slot between
  // them (the persistent attention forward's work item): the wait for the slot's release, then the
  // arrive_expect_tx (release semantics: what the thread wrote before it is visible to a consumer
  // whose wait returns). 0 bytes completes the phase at once: a round with no copies.
  __device__ __forceinline__ void wait_free(int round) const {
    if (round >= STAGES) ladle_mbarrier_wait(&empty[round % STAGES], (round / STAGES - 1) & 1);
  }
  __device__ __forceinline__ unsigned long long* announce(int round, unsigned bytes) const {
    ladle_mbarrier_arrive_expect_tx(&full[round % STAGES], bytes);
    return &full[round % STAGES];
  }
  // A consumer: returns once round `round`'s copies have landed.
  __device__ __forceinline__ void wait(int round) const { ladle_mbarrier_wait(&full[round % STAGES], (round / STAGES) & 1); }
  // Every lane of a consumer warp once the warp is done with round `round`'s slot (lane 0 arrives).
  __device__ __forceinline__ void release(int round, int lane) const {
    if (lane == 0) ladle_mbarrier_arrive(&empty[round % STAGES]);
  }
};

// A copy barrier used once (q's tile in the attention forward, a block's K and V in its backward):
// the producer announces the bytes, the consumers wait for its first phase.
struct ladle_copy_latch {
  unsigned long long* bar;

  __device__ __forceinline__ void init() const { ladle_mbarrier_init(bar, 1); }
  __device__ __forceinline__ void expect(unsigned bytes) const { ladle_mbarrier_arrive_expect_tx(bar, bytes); }
  __device__ __forceinline__ void wait() const { ladle_mbarrier_wait(bar, 0); }
};

// The roles of a warp-specialised block: warpgroup 0 produces (one of its threads issues the
// copies), the others consume. With PRODUCER_REGISTERS > 0 the producer gives registers back
// (setmaxnreg.dec) and the consumers take CONSUMER_REGISTERS each (setmaxnreg.inc); 0 keeps the
// launch's share. True in the producer's warpgroup, which leaves once its copies are issued.
template <int PRODUCER_REGISTERS, int CONSUMER_REGISTERS>
__device__ __forceinline__ bool ladle_producer_warpgroup() {
  if (threadIdx.x < 128) {
    if constexpr (PRODUCER_REGISTERS > 0) ladle_setmaxnreg_dec<PRODUCER_REGISTERS>();
    return true;
  }
  if constexpr (CONSUMER_REGISTERS > 0) ladle_setmaxnreg_inc<CONSUMER_REGISTERS>();
  return false;
}
// Two consumer warpgroups taking turns to issue their tensor-core products (ping-pong), so that
// one warpgroup's products run while the other forms its softmax. Named barrier 1 + w is
// warpgroup w's turn: it waits there for the other's hand-over (both warpgroups count: 256
// threads), issues, then arrives at the other's. Warpgroup 1 hands warpgroup 0 its first turn
// before the loop, so warpgroup 1's last issue hands none over.
struct ladle_pingpong {
  int warpgroup;  // 0 or 1 among the consumers

  __device__ __forceinline__ void start() const {
    if (warpgroup == 1) ladle_named_barrier_arrive(1, 256);  // warpgroup 0 issues first
  }
  __device__ __forceinline__ void take_turn() const { ladle_named_barrier_sync(1 + warpgroup, 256); }
  __device__ __forceinline__ void pass_turn() const { ladle_named_barrier_arrive(2 - warpgroup, 256); }
  __device__ __forceinline__ void pass_last_turn() const {
    if (warpgroup == 0) ladle_named_barrier_arrive(2, 256);
  }
  // A persistent kernel keeps the turns going from one work item to the next (start() once, every
  // issue passes the turn): after the last item, warpgroup 0 takes the hand-over warpgroup 1's
  // last issue left pending, so that no arrival outlives the block.
  __device__ __forceinline__ void finish() const {
    if (warpgroup == 0) ladle_named_barrier_sync(1, 256);
  }
};
#endif  // LADLE_STAGE_RING
