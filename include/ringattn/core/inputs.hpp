#pragma once
// Counter-based input generation: every element is a pure function of (seed, tensor, global
// index), so the global tensors are identical whatever N and the layout are, and each rank
// generates only its own positions. Values are approximately N(0, 1): the Irwin-Hall sum of four
// 16-bit uniforms from one splitmix64 hash, using only exact arithmetic (identical on every host).
#include <cstdint>
#include <span>
#include <vector>

#include "ringattn/core/layout.hpp"

namespace ringattn::core {

enum class InputTensor : std::uint64_t { q = 1, k = 2, v = 3, dout = 4, x = 5, wq = 6, wk = 7, wv = 8, wo = 9, dy = 10 };

double input_value(std::uint64_t seed, InputTensor t, std::uint64_t flat_index);

// Fill out [outer, L, inner] with the positions of `runs` of a global tensor shaped
// [outer, S, inner] (position axis in the middle).
template <class T>
void generate_positions(std::uint64_t seed, InputTensor t, Index outer, Index S, Index inner,
                        std::span<const Run> runs, Index L, T* out);

}  // namespace ringattn::core
