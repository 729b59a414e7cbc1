#pragma once
// NumPy .npy files: C-order, little-endian '<f2' (float16) / '<f4' / '<f8' tensors only.
// Reads format versions 1.0, 2.0 and 3.0; writes 1.0 (2.0 when the header needs a 4-byte
// length) with the same header bytes numpy 1.24 writes, so np.load reads our files and a
// diff against np.save output is empty.
//
// Shards: a tensor's "position axis" (S) may be split over ranks. With
//   outer = prod(shape[0:pos_axis]), inner = prod(shape[pos_axis+1:]),
// the file holds [outer, S, inner] and a shard buffer holds [outer, L, inner]; each core::Run
// maps run.length positions from global_begin (file) to local_begin (buffer).
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ringattn/core/half.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/shape.hpp"

namespace ringattn::io {

struct NpyHeader {
  core::DType dtype = core::DType::f32;
  std::vector<core::Index> shape;
  std::size_t data_offset = 0;  // bytes from file start
  core::Index elements() const;  // product of shape (1 for a 0-d tensor)
  std::size_t data_bytes() const { return static_cast<std::size_t>(elements()) * core::dtype_size(dtype); }
};

// "<f8 (2, 3)" style description used in messages.
std::string describe(core::DType dtype, const std::vector<core::Index>& shape);
std::string npy_descr(core::DType dtype);  // "<f2", "<f4" or "<f8"

// Parse and fully validate a header from the first bytes of a file (the whole file may be
// passed; bytes past the header are ignored). `name` is used in messages.
// Throws InputError with ONE line: "<name>: <what is wrong> (expected <what>)", and nothing
// else, on any input bytes (the parser is meant to be fuzzed).
NpyHeader parse_npy_header(std::string_view bytes, const std::string& name);

// Open, parse, and check the file size equals data_offset + elements * dtype_size.
// A missing file, truncated data or trailing bytes throw InputError naming the file.
NpyHeader read_npy_header(const std::string& path);

// Read the positions `runs` (see top of file) into out, [outer, L, inner], converting the file
// dtype to T. Only the shard's bytes are read (pread, contiguous bytes coalesced).
template <class T>
void read_npy_positions(const std::string& path, const NpyHeader& h, int pos_axis,
                        std::span<const core::Run> runs, core::Index L, T* out);

// The whole tensor, converted to T.
template <class T>
std::vector<T> read_npy(const std::string& path, const NpyHeader& h);

// Element `flat` (row-major index) of the file as it is stored, widened to double: what a
// converted value was before conversion.
double read_npy_element(const std::string& path, const NpyHeader& h, core::Index flat);

// The header bytes create_npy writes (numpy's exact format); its size is the data offset.
std::string npy_header_bytes(core::DType dtype, const std::vector<core::Index>& shape);

// Create (truncate) `path` holding the header and a zero-filled data region of the full size.
// Throws RuntimeFailure naming the path when the file cannot be created or written.
void create_npy(const std::string& path, core::DType dtype, const std::vector<core::Index>& shape);

// Write positions into a file made by create_npy; `data` is [outer, L, inner] as for
// read_npy_positions and is converted to dtype. Several processes may write disjoint runs of
// the same file at once (pwrite, no truncation). Throws RuntimeFailure naming the path on an
// I/O failure or when the file's header is not the one create_npy writes for dtype/shape.
template <class T>
void write_npy_positions(const std::string& path, core::DType dtype, const std::vector<core::Index>& shape,
                         int pos_axis, std::span<const core::Run> runs, core::Index L, const T* data);

// Create `path` and write the whole tensor.
template <class T>
void write_npy(const std::string& path, core::DType dtype, const std::vector<core::Index>& shape, const T* data);

}  // namespace ringattn::io
