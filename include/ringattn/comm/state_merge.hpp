#pragma once
// The collectives of a decode step's merge, over partial online-softmax states: one record per
// query row, [m, l, a_0 .. a_{D-1}] (m the running max in log2 units, l the exp-sum, a the
// weighted sum of V rows), every rank holding the same rows.
//   all_gather_fixed:  every rank's records, in rank order, on every rank (one MPI_Allgather); the
//                      caller merges them in rank order, so every rank computes the same bits.
//   allreduce_states:  the merged records on every rank by recursive doubling with fixed partners
//                      (m = max m_r, l = sum l_r 2^(m_r - m), a = sum a_r 2^(m_r - m)): log2 N
//                      rounds; the same bits on every rank and on every run with that N.
//   allreduce_sum:     MPI_Allreduce(MPI_SUM) of as many values: the yardstick a merge is held to.
#include <span>

#include "ringattn/comm/comm.hpp"

namespace ringattn::comm {

template <class T>
void all_gather_fixed(const Comm& comm, std::span<const T> mine, std::span<T> all);

template <class T>
void allreduce_states(const Comm& comm, std::span<T> records, int head_dim);

template <class T>
void allreduce_sum(const Comm& comm, std::span<T> values);

}  // namespace ringattn::comm
