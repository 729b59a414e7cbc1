#include "ringattn/io/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <concepts>
#include <cstdint>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <limits>
#include <system_error>
#include <utility>

#include "npy_detail.hpp"
#include "ringattn/core/errors.hpp"

namespace ringattn::io {

using core::DType;
using core::Index;
using core::Run;

static_assert(std::endian::native == std::endian::little,
              "npy I/O copies '<f2'/'<f4'/'<f8' bytes as they are: it needs a little-endian host");

using namespace detail;

namespace {

// Conversion goes through a bounded staging buffer so a shard never needs a second full copy.
constexpr Index kStageElems = Index{1} << 16;

// RAII file descriptor; close() is explicit on success paths so its error is not lost.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Bytes read; fewer than n only at end of file. -1 with errno set on an error.
ssize_t pread_full(int fd, void* buf, std::size_t n, std::uint64_t offset) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, static_cast<char*>(buf) + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -1;
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return static_cast<ssize_t>(done);
}

void pwrite_full(int fd, const void* buf, std::size_t n, std::uint64_t offset, const std::string& path) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t put =
        ::pwrite(fd, static_cast<const char*>(buf) + done, n - done, static_cast<off_t>(offset + done));
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      const int err = put < 0 ? errno : ENOSPC;  // a write of 0 bytes means no space
      io_failure(path, fmt::format("cannot write {} bytes at offset {}", n - done, offset + done), err);
    }
    done += static_cast<std::size_t>(put);
  }
}

void close_checked(Fd& fd, const std::string& path) {
  if (fd.close() != 0) io_failure(path, "close failed", errno);
}

// [outer, S, inner] around the position axis.
struct Geometry {
  Index outer = 1, S = 0, inner = 1;
};

Geometry geometry(const std::vector<Index>& shape, int pos_axis, const std::string& path) {
  if (pos_axis < 0 || static_cast<std::size_t>(pos_axis) >= shape.size()) {
    bad_input(path, fmt::format("position axis {} does not exist in shape {}", pos_axis, shape_repr(shape)),
              fmt::format("a tensor with more than {} dimensions", std::max(pos_axis, 0)));
  }
  Geometry g;
  for (int a = 0; a < pos_axis; ++a) g.outer *= shape[a];
  g.S = shape[pos_axis];
  for (std::size_t a = pos_axis + 1; a < shape.size(); ++a) g.inner *= shape[a];
  return g;
}

void check_runs(const Geometry& g, std::span<const Run> runs, Index L, const std::string& path) {
  Index buffer = 0;
  if (L < 0 || __builtin_mul_overflow(g.outer, L, &buffer) || __builtin_mul_overflow(buffer, g.inner, &buffer)) {
    bad_input(path, fmt::format("shard length L={} is invalid", L), "0 <= L with outer*L*inner in int64");
  }
  for (const Run& r : runs) {
    if (r.length < 0 || r.global_begin < 0 || r.local_begin < 0 || r.global_begin > g.S - r.length ||
        r.local_begin > L - r.length) {
      bad_input(path,
                fmt::format("run (global {}, local {}, length {}) is outside the file's {} positions or the "
                            "shard's {}",
                            r.global_begin, r.local_begin, r.length, g.S, L),
                "runs inside both");
    }
  }
}

// Calls fn(file_elem, buffer_elem, count) for each maximal stretch contiguous both in the file
// ([outer, S, inner]) and in the buffer ([outer, L, inner]), in increasing buffer order for
// sorted runs. A contiguous layout thus becomes one call per outer index (or one in all).
template <class Fn>
void for_each_segment(const Geometry& g, std::span<const Run> runs, Index L, Fn&& fn) {
  if (g.outer == 0 || g.inner == 0) return;
  Index f0 = 0, b0 = 0, n = 0;  // the pending segment
  for (Index o = 0; o < g.outer; ++o) {
    for (const Run& r : runs) {
      if (r.length == 0) continue;
      const Index f = (o * g.S + r.global_begin) * g.inner;
      const Index b = (o * L + r.local_begin) * g.inner;
      const Index c = r.length * g.inner;
      if (n > 0 && f == f0 + n && b == b0 + n) {
        n += c;
        continue;
      }
      if (n > 0) fn(f0, b0, n);
      f0 = f;
      b0 = b;
      n = c;
    }
  }
  if (n > 0) fn(f0, b0, n);
}

// Reads count elements of FileT starting at element file_elem into dst as T.
template <class FileT, class T>
void read_as(int fd, const std::string& path, std::size_t data_offset, Index file_elem, Index count, T* dst,
             std::vector<FileT>& stage) {
  const std::uint64_t offset = data_offset + static_cast<std::uint64_t>(file_elem) * sizeof(FileT);
  const auto chunk = [&](void* buf, Index done, Index n) {
    const std::size_t want = static_cast<std::size_t>(n) * sizeof(FileT);
    const ssize_t got = pread_full(fd, buf, want, offset + static_cast<std::uint64_t>(done) * sizeof(FileT));
    if (got < 0) {
      const int err = errno;
      io_failure(path, fmt::format("read failed at byte {}", offset + done * sizeof(FileT)), err);
    }
    if (static_cast<std::size_t>(got) != want) {
      bad_input(path, fmt::format("data is truncated: the file ended at byte {}", offset + done * sizeof(FileT) + got),
                "the data size its header gives (did the file change while being read?)");
    }
  };
  if constexpr (std::same_as<FileT, T>) {
    chunk(dst, 0, count);
  } else {
    stage.resize(static_cast<std::size_t>(std::min(count, kStageElems)));
    for (Index done = 0; done < count; done += kStageElems) {
      const Index n = std::min(kStageElems, count - done);
      chunk(stage.data(), done, n);
      std::transform(stage.begin(), stage.begin() + n, dst + done, [](FileT x) { return core::value_cast<T>(x); });
    }
  }
}

template <class FileT, class T>
void write_as(int fd, const std::string& path, std::size_t data_offset, Index file_elem, Index count, const T* src,
              std::vector<FileT>& stage) {
  const std::uint64_t offset = data_offset + static_cast<std::uint64_t>(file_elem) * sizeof(FileT);
  if constexpr (std::same_as<FileT, T>) {
    pwrite_full(fd, src, static_cast<std::size_t>(count) * sizeof(FileT), offset, path);
  } else {
    stage.resize(static_cast<std::size_t>(std::min(count, kStageElems)));
    for (Index done = 0; done < count; done += kStageElems) {
      const Index n = std::min(kStageElems, count - done);
      std::transform(src + done, src + done + n, stage.begin(), [](T x) { return core::value_cast<FileT>(x); });
      pwrite_full(fd, stage.data(), static_cast<std::size_t>(n) * sizeof(FileT),
                  offset + static_cast<std::uint64_t>(done) * sizeof(FileT), path);
    }
  }
}

// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever; it changes
// nothing for regular files, and anything else is refused here, on every read path.
Fd open_for_read(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.ok()) bad_input(path, fmt::format("cannot open: {}", errno_text(errno)), "a readable .npy file");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) bad_input(path, fmt::format("cannot stat: {}", errno_text(errno)), "a readable .npy file");
  if (!S_ISREG(st.st_mode)) bad_input(path, "not a regular file", "a .npy file");
  return fd;
}

// Calls run((FileT*)nullptr) with the element type files of dtype hold ('<f2' is f16; bf16 has
// no numpy type).
template <class Run>
void file_type(DType dtype, const std::string& path, Run&& run) {
  switch (dtype) {
    case DType::f32: return run(static_cast<float*>(nullptr));
    case DType::f64: return run(static_cast<double*>(nullptr));
    case DType::f16: return run(static_cast<core::f16*>(nullptr));
    case DType::bf16: break;
  }
  throw RuntimeFailure(fmt::format("{}: bf16 has no .npy type (expected f16, f32 or f64 files)", path));
}

// Reads all segments of a file with dtype FileT into out as T.
template <class T>
void read_segments(const std::string& path, const NpyHeader& h, const Geometry& g, std::span<const Run> runs,
                   Index L, T* out) {
  Fd fd = open_for_read(path);
  const auto run = [&]<class FileT>(FileT*) {
    std::vector<FileT> stage;
    for_each_segment(g, runs, L, [&](Index f, Index b, Index n) {
      read_as<FileT, T>(fd.get(), path, h.data_offset, f, n, out + b, stage);
    });
  };
  file_type(h.dtype, path, run);
}

// Opens a file made by create_npy and checks its header is the one we would write.
Fd open_for_update(const std::string& path, const std::string& header) {
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.ok()) io_failure(path, "cannot open for writing", errno);
  std::string found(header.size(), '\0');
  const ssize_t got = pread_full(fd.get(), found.data(), found.size(), 0);
  if (got < 0) io_failure(path, "cannot read the header back", errno);
  if (found != header) {
    throw RuntimeFailure(fmt::format("{}: header does not match the tensor being written (expected a file made by "
                                     "create_npy for the same dtype and shape)",
                                     path));
  }
  return fd;
}

template <class T>
void write_segments(int fd, const std::string& path, DType dtype, std::size_t data_offset, const Geometry& g,
                    std::span<const Run> runs, Index L, const T* data) {
  const auto run = [&]<class FileT>(FileT*) {
    std::vector<FileT> stage;
    for_each_segment(g, runs, L, [&](Index f, Index b, Index n) {
      write_as<FileT, T>(fd, path, data_offset, f, n, data + b, stage);
    });
  };
  file_type(dtype, path, run);
}

Fd create_file(const std::string& path, DType dtype, const std::vector<Index>& shape, std::string* header) {
  check_shape_for_write(shape, dtype, path);
  *header = npy_header_bytes(dtype, shape);
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.ok()) io_failure(path, "cannot create", errno);
  pwrite_full(fd.get(), header->data(), header->size(), 0, path);
  Index elements = 1;
  for (Index d : shape) elements *= d;
  const auto size = static_cast<off_t>(header->size() + static_cast<std::size_t>(elements) * core::dtype_size(dtype));
  // Sized up front (zero-filled, sparse) so ranks can pwrite disjoint runs in any order.
  if (::ftruncate(fd.get(), size) != 0) {
    const int err = errno;
    io_failure(path, fmt::format("cannot size the file to {} bytes", size), err);
  }
  return fd;
}

}  // namespace





NpyHeader read_npy_header(const std::string& path) {
  Fd fd = open_for_read(path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) bad_input(path, fmt::format("cannot stat: {}", errno_text(errno)), "a readable .npy file");
  if (!S_ISREG(st.st_mode)) bad_input(path, "not a regular file", "a .npy file");
  const auto file_size = static_cast<std::uint64_t>(st.st_size);

  // First the preamble (at most 12 bytes), then exactly the header it announces (bounded by
  // the file size, so a corrupt length never makes us allocate more than the file).
  std::string bytes(static_cast<std::size_t>(std::min<std::uint64_t>(file_size, 12)), '\0');
  const auto read_prefix = [&]() {
    const ssize_t got = pread_full(fd.get(), bytes.data(), bytes.size(), 0);
    if (got < 0) bad_input(path, fmt::format("cannot read: {}", errno_text(errno)), "a readable .npy file");
    bytes.resize(static_cast<std::size_t>(got));
  };
  read_prefix();
  const Preamble p = parse_preamble(bytes, path);
  bytes.resize(static_cast<std::size_t>(std::min<std::uint64_t>(file_size, p.header_begin + p.header_len)));
  read_prefix();
  NpyHeader h = parse_npy_header(bytes, path);

  const std::uint64_t expected = h.data_offset + h.data_bytes();
  if (file_size < expected) {
    bad_input(path,
              fmt::format("data is truncated: the file has {} bytes but {} needs {}", file_size,
                          describe(h.dtype, h.shape), expected),
              fmt::format("{} bytes", expected));
  }
  if (file_size > expected) {
    bad_input(path,
              fmt::format("{} trailing bytes after the data of {}", file_size - expected, describe(h.dtype, h.shape)),
              fmt::format("the file to end at byte {}", expected));
  }
  return h;
}

template <class T>
void read_npy_positions(const std::string& path, const NpyHeader& h, int pos_axis, std::span<const Run> runs,
                        Index L, T* out) {
  const Geometry g = geometry(h.shape, pos_axis, path);
  check_runs(g, runs, L, path);
  read_segments(path, h, g, runs, L, out);
}

template <class T>
std::vector<T> read_npy(const std::string& path, const NpyHeader& h) {
  const Index n = h.elements();
  std::vector<T> out(static_cast<std::size_t>(n));
  // The whole tensor as one run of a flat [n] view.
  const Run all{0, 0, n};
  read_segments(path, h, Geometry{1, n, 1}, std::span<const Run>(&all, 1), n, out.data());
  return out;
}

double read_npy_element(const std::string& path, const NpyHeader& h, Index flat) {
  const Index n = h.elements();
  if (flat < 0 || flat >= n)
    throw RuntimeFailure(fmt::format("{}: element {} is outside the file's {} elements", path, flat, n));
  const Run one{flat, 0, 1};
  double x = 0;
  read_segments(path, h, Geometry{1, n, 1}, std::span<const Run>(&one, 1), 1, &x);
  return x;
}

void create_npy(const std::string& path, DType dtype, const std::vector<Index>& shape) {
  std::string header;
  Fd fd = create_file(path, dtype, shape, &header);
  close_checked(fd, path);
}

template <class T>
void write_npy_positions(const std::string& path, DType dtype, const std::vector<Index>& shape, int pos_axis,
                         std::span<const Run> runs, Index L, const T* data) {
  check_shape_for_write(shape, dtype, path);
  const Geometry g = geometry(shape, pos_axis, path);
  check_runs(g, runs, L, path);
  const std::string header = npy_header_bytes(dtype, shape);
  Fd fd = open_for_update(path, header);
  write_segments(fd.get(), path, dtype, header.size(), g, runs, L, data);
  close_checked(fd, path);
}

template <class T>
void write_npy(const std::string& path, DType dtype, const std::vector<Index>& shape, const T* data) {
  std::string header;
  Fd fd = create_file(path, dtype, shape, &header);
  Index n = 1;
  for (Index d : shape) n *= d;
  const Run all{0, 0, n};
  write_segments(fd.get(), path, dtype, header.size(), Geometry{1, n, 1}, std::span<const Run>(&all, 1), n, data);
  close_checked(fd, path);
}

#define RINGATTN_NPY_INSTANTIATE(T)                                                                                \
  template void read_npy_positions<T>(const std::string&, const NpyHeader&, int, std::span<const Run>, Index, T*); \
  template std::vector<T> read_npy<T>(const std::string&, const NpyHeader&);                                       \
  template void write_npy_positions<T>(const std::string&, DType, const std::vector<Index>&, int,                  \
                                       std::span<const Run>, Index, const T*);                                     \
  template void write_npy<T>(const std::string&, DType, const std::vector<Index>&, const T*);

RINGATTN_NPY_INSTANTIATE(float)
RINGATTN_NPY_INSTANTIATE(double)
RINGATTN_NPY_INSTANTIATE(core::bf16)
RINGATTN_NPY_INSTANTIATE(core::f16)
#undef RINGATTN_NPY_INSTANTIATE

}  // namespace ringattn::io
