#pragma once
// All-gather attention (the context parallelism of Llama 3, PyTorch's default rotater, TE's
// all_gather): every rank gathers the whole sequence's K/V and attends its own queries to them.
//
// The KV heads are taken in groups of G (setup.kv_head_group; HKV/G groups). For group g, on every
// rank:
//   forward:  all-gather the group's K/V blocks ([B, G, L_q, D] packed, from every rank q), the next
//             group's gather in flight while this one is attended; the rank's query rows of the
//             group's query heads attend block q = 0 .. N-1 in rank order with the online softmax;
//   backward: the group's K/V gathered again (as in the forward, the next group in flight); dQ kept
//             locally; blocks taken in the order r+1, .., r (mod N), each block's dK/dV
//             contribution computed into a buffer of all S positions and sent to its owner as soon
//             as it is done (a reduce-scatter pipelined with the compute, each owner receiving from
//             one rank at a time); the owner sums them in source-rank order (in the accumulation
//             type), so results are bitwise reproducible for N and G.
// Memory: two gathered groups (2 x 2 B G S D storage elements) and, in the backward, one group's
// contributions for all S positions (2 B G S D accumulation elements).
//
// Sliced exchange: with a sliding window or documents, rank r's queries see only part of the
// sequence. Every rank computes, from the layout and the mask alone, the range of each owner's
// positions (local indices [lo, hi), the smallest range covering every key a query of r sees) that
// rank r needs; when some rank needs less than everything, the gather becomes point-to-point
// messages of exactly those slices (the next group's still in flight while this one is attended),
// the blocks attended are the slices, and the reduce-scatter returns dK/dV for the slices only,
// summed by the owner in source-rank order. Without a mask, or with a plain causal mask, every
// rank's full all-gather is kept (the MPI collective): a causal contiguous layout would let rank r
// skip the keys after its last query, but the busiest rank (r = N - 1 receives, r = 0 sends) moves
// the same (N - 1) L as in the all-gather, and the default zigzag layout's rank 0 needs everything.
//
// Types: K/V travel in the storage type S; dK/dV contributions in A = accum_t<S>.
#include <memory>
#include <vector>

#include "ringattn/core/aligned.hpp"
#include "ringattn/runtime/strategy.hpp"

namespace ringattn::runtime {

template <class S>
class AllGatherAttention final : public Strategy<S> {
 public:
  using A = core::accum_t<S>;
  // setup.kv_head_group divides HKV (the plan checks).
  AllGatherAttention(const comm::Comm& comm, const StrategySetup& setup);

  void load(const S* q, const S* k, const S* v) override;
  void load_dout(const S* dout) override;
  void load_dlse(const A* dlse) override;
  void add_sink_grad(double* dsinks) const override;
  PassStats forward() override;
  PassStats backward() override;
  void outputs(A* o, A* lse, A* dq, A* dk, A* dv) const override;
  const core::Ledger& ledger() const override { return ledger_; }
  Index local_size() const override { return L_; }
  Index resident_bytes() const override;

 private:
  // One KV-head group on this rank: its query rows (packed), the online state, and after the
  // backward its dQ and this rank's own dK/dV.
  struct Group {
    core::AlignedVector<S> q, dout;
    core::AlignedVector<A> m, l, acc, lse, delta, dq, dkv;
    core::AlignedVector<A> dlse;  // dL/dLSE of the rows, when given
  };
  // What one rank needs of an owner's positions: local indices [lo, hi) of the owner's shard.
  struct Range {
    Index lo = 0, hi = 0;
    Index size() const { return hi - lo; }
  };
  // Group g's K/V slice of `owner` as this rank gathers it (need_[owner] of its positions).
  core::Packing block_packing(int owner) const;
  Index block_elems(int owner) const { return 2 * block_packing(owner).kv_elems(); }
  // The same for the slice rank `peer` needs of this rank (give_[peer]).
  Index give_elems(int peer) const { return 2 * s_.shape.B * G_ * give_[peer].size() * s_.shape.D; }
  core::Packing own_packing() const;  // this rank's whole block: [B, G, L, D]
  // Starts group g's all-gather into gathered_[slot] (its own block packed from k_, v_ first);
  // returns the bytes it sends and receives.
  Index start_gather(int g, int slot, comm::Exchange& x, Pass pass);
  core::KVBlock<S> view(int owner, const S* gathered) const;
  void allocate_backward();

  const comm::Comm& comm_;
  StrategySetup s_;
  int r_, N_, G_, groups_;   // G kv heads per group, HKV / G groups
  Index L_;
  bool sliced_ = false;       // point-to-point slices instead of the all-gather
  // Point-to-point messages instead of MPI_Iallgatherv: when sliced, and in the simulation build,
  // whose collectives are blocking (SMPI's nonblocking ones fan out point to point anyway), so
  // that the simulated gather overlaps the compute as the real one does.
  bool p2p_ = false;
  std::vector<Range> need_;   // [N]: what this rank needs of owner q's positions
  std::vector<Range> give_;   // [N]: what rank q needs of this rank's positions
  std::vector<Index> displ_;  // [N + 1]: where owner q's slice starts in a gathered group (elements)
  std::vector<Index> sdispl_; // [N + 1]: where peer q's slice starts in send_ (elements)
  std::vector<Index> rdispl_; // [N + 1]: where source q's dK/dV slice starts in returned_ (elements)
  core::Packing pq_;          // one group's query rows: [B, G, L, H/HKV, D]
  std::vector<S> q_file_, k_file_, v_file_, dout_file_;  // this rank's shard, file order
  std::vector<Group> g_;
  core::AlignedVector<S> own_block_;     // this rank's block of the group being gathered
  core::AlignedVector<S> send_;          // sliced: every peer's slice of this rank's block
  core::AlignedVector<S> gathered_[2];   // two groups' K/V of every rank
  core::AlignedVector<A> contrib_;       // backward: one group's dK/dV for all S positions, rank-major
  core::AlignedVector<A> returned_;      // backward: every other rank's contribution to this rank's block
  core::Workspace<A> ws_;
  core::Ledger ledger_;
  bool backward_ready_ = false;
  bool has_dlse_ = false;
};

}  // namespace ringattn::runtime
