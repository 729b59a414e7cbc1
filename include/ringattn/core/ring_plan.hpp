#pragma once
// Which transfers the ring makes. At step j rank r holds the block of owner (r - j) mod N
// (both passes); the plan says whether that block reaches r at all, whether r returns a gradient
// for it, and after how many steps the ring may stop.
//
//   full:   the teaching protocol. Every block visits every rank (N-1 hops), every
//           gradient contribution goes back, even one that carries only zeros.
//   aware:  traffic-aware. Rank r needs block o when some (query of r, key of o) pair is visible.
//           A block travels o -> o+1 -> ... only as far as the farthest rank on that path that
//           needs it; gradients are returned only for needed blocks; the ring ends after the last
//           step any rank needs. Under a causal window on contiguous shards the bytes moved then
//           scale with W, not S.
//   skip_empty_grads: full K/V traffic, but no return of all-zero contributions (lab --skip-empty).
#include <vector>

#include "ringattn/core/layout.hpp"
#include "ringattn/core/mask.hpp"

namespace ringattn::core {

enum class Traffic { full, aware, skip_empty_grads };

class RingPlan {
 public:
  RingPlan(const Layout& layout, const Mask& mask, Traffic traffic);

  int ranks() const { return N_; }
  int steps() const { return steps_; }  // steps every rank runs (1 .. N)
  int owner(int r, int j) const { return ((r - j) % N_ + N_) % N_; }
  // Whether rank r needs block o for its own queries.
  bool needs(int r, int o) const { return needs_[r * N_ + o]; }
  // Whether rank r holds the block of owner(r, j) at step j (its own at j = 0; received otherwise).
  bool holds(int r, int j) const { return j == 0 || receives(r, j); }
  // Whether rank r receives the block of owner(r, j) from r-1 for step j (j >= 1).
  bool receives(int r, int j) const;
  // Whether rank r sends its step-j block on to r+1 (the successor receives it for step j+1).
  bool sends(int r, int j) const { return j + 1 < steps_ && receives((r + 1) % N_, j + 1); }
  // Whether rank r returns a dK/dV contribution to owner(r, j) after step j (j >= 1).
  bool returns_grad(int r, int j) const;

 private:
  int N_, steps_;
  Traffic traffic_;
  std::vector<char> needs_;  // [N * N]
  std::vector<int> reach_;   // [N] farthest hop (ring distance from the owner) that needs block o
};

}  // namespace ringattn::core
