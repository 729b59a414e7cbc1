#include "ringattn/core/ring_plan.hpp"

#include <algorithm>

#include "ringattn/core/block_attention.hpp"

namespace ringattn::core {

RingPlan::RingPlan(const Layout& layout, const Mask& mask, Traffic traffic)
    : N_(layout.ranks()), traffic_(traffic), needs_(N_ * N_, 0), reach_(N_, 0) {
  for (int r = 0; r < N_; ++r)
    for (int o = 0; o < N_; ++o) needs_[r * N_ + o] = block_visible(mask, layout.positions(r), layout.positions(o));
  for (int o = 0; o < N_; ++o)
    for (int t = 1; t < N_; ++t)
      if (needs((o + t) % N_, o)) reach_[o] = t;
  if (traffic_ == Traffic::aware) {
    steps_ = 1 + *std::max_element(reach_.begin(), reach_.end());
  } else {
    steps_ = N_;
  }
}

bool RingPlan::receives(int r, int j) const {
  if (j < 1 || j >= steps_) return false;
  if (traffic_ != Traffic::aware) return true;
  // The block of o = r - j has come j hops; it is worth receiving if this rank or one further
  // along the path still needs it.
  return j <= reach_[owner(r, j)];
}

bool RingPlan::returns_grad(int r, int j) const {
  if (j < 1 || j >= steps_) return false;
  if (traffic_ == Traffic::full) return true;
  return needs(r, owner(r, j));
}

}  // namespace ringattn::core
