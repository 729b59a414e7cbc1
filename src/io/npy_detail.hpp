#pragma once
// What the .npy sources share (private to src/io): one-line errors and the header's first bytes.
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ringattn/core/shape.hpp"

namespace ringattn::io::detail {

std::string errno_text(int e);
[[noreturn]] void bad_input(const std::string& name, std::string_view what, std::string_view expected);
[[noreturn]] void io_failure(const std::string& path, std::string_view what, int err);
// Python's repr of a shape tuple: (), (5,), (2, 3).
std::string shape_repr(const std::vector<core::Index>& shape);
// Every dimension non-negative, and data_offset + prod(max(d, 1)) * itemsize fits in int64, so
// any partial product (outer, inner, offsets) is safe to compute even when a dimension is 0.
// Returns an empty string when valid, else what is wrong.
std::string shape_problem(const std::vector<core::Index>& shape, core::DType dtype, std::size_t data_offset);
void check_shape_for_write(const std::vector<core::Index>& shape, core::DType dtype, const std::string& path);

struct Preamble {
  int major = 0;
  std::size_t header_begin = 0;  // first byte of the dict text
  std::size_t header_len = 0;    // as stored; not yet checked against the file size
};
// Magic, version and header length; needs at most the first 12 bytes.
Preamble parse_preamble(std::string_view b, const std::string& name);

}  // namespace ringattn::io::detail
