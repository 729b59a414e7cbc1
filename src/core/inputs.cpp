#include "ringattn/core/inputs.hpp"

#include "ringattn/core/half.hpp"

namespace ringattn::core {

static std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double input_value(std::uint64_t seed, InputTensor t, std::uint64_t flat_index) {
  const std::uint64_t h =
      splitmix64(splitmix64(seed ^ (static_cast<std::uint64_t>(t) << 56)) + flat_index * 0xD1B54A32D192ED03ull);
  double sum = 0;
  for (int c = 0; c < 4; ++c) sum += static_cast<double>((h >> (16 * c)) & 0xFFFF) + 0.5;
  // four U(0,1): mean 2, variance 1/3; scaled by sqrt(3) to unit variance
  return (sum / 65536.0 - 2.0) * 1.7320508075688772;
}

template <class T>
void generate_positions(std::uint64_t seed, InputTensor t, Index outer, Index S, Index inner,
                        std::span<const Run> runs, Index L, T* out) {
  for (Index a = 0; a < outer; ++a)
    for (const Run& run : runs)
      for (Index p = 0; p < run.length; ++p) {
        const Index global = (a * S + run.global_begin + p) * inner;
        T* dst = out + (a * L + run.local_begin + p) * inner;
        for (Index e = 0; e < inner; ++e) dst[e] = value_cast<T>(input_value(seed, t, global + e));
      }
}

template void generate_positions<float>(std::uint64_t, InputTensor, Index, Index, Index, std::span<const Run>, Index,
                                        float*);
template void generate_positions<double>(std::uint64_t, InputTensor, Index, Index, Index, std::span<const Run>, Index,
                                         double*);

template void generate_positions<bf16>(std::uint64_t, InputTensor, Index, Index, Index, std::span<const Run>, Index,
                                       bf16*);
template void generate_positions<f16>(std::uint64_t, InputTensor, Index, Index, Index, std::span<const Run>, Index,
                                      f16*);

}  // namespace ringattn::core
