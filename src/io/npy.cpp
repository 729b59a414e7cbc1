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

#include "ringattn/core/errors.hpp"

namespace ringattn::io {

using core::DType;
using core::Index;
using core::Run;

static_assert(std::endian::native == std::endian::little,
              "npy I/O copies '<f4'/'<f8' bytes as they are: it needs a little-endian host");

namespace {

using namespace std::string_view_literals;

constexpr std::string_view kMagic = "\x93NUMPY"sv;
constexpr Index kIndexMax = std::numeric_limits<Index>::max();
// numpy 1.24 `format.GROWTH_AXIS_MAX_DIGITS`: spaces left after the dict so axis 0 can grow in place.
constexpr std::size_t kGrowthAxisMaxDigits = 21;
constexpr std::size_t kArrayAlign = 64;  // numpy `format.ARRAY_ALIGN`
// Conversion goes through a bounded staging buffer so a shard never needs a second full copy.
constexpr Index kStageElems = Index{1} << 16;

std::string errno_text(int e) { return std::system_category().message(e); }

// Bytes from the file shown in a one-line message: printable ASCII kept, the rest escaped.
std::string printable(std::string_view s, std::size_t max = 32) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > max) out += "...";
  return out;
}

[[noreturn]] void bad_input(const std::string& name, std::string_view what, std::string_view expected) {
  throw InputError(fmt::format("{}: {} (expected {})", name, what, expected));
}

[[noreturn]] void io_failure(const std::string& path, std::string_view what, int err) {
  throw RuntimeFailure(fmt::format("{}: {}: {}", path, what, errno_text(err)));
}

// Python's repr of a shape tuple: (), (5,), (2, 3).
std::string shape_repr(const std::vector<Index>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

// Every dimension non-negative, and data_offset + prod(max(d, 1)) * itemsize fits in int64, so
// any partial product (outer, inner, offsets) is safe to compute even when a dimension is 0.
// Returns an empty string when valid, else what is wrong.
std::string shape_problem(const std::vector<Index>& shape, DType dtype, std::size_t data_offset) {
  for (Index d : shape) {
    if (d < 0) return fmt::format("shape {} has a negative dimension", shape_repr(shape));
  }
  const auto limit = static_cast<Index>((static_cast<std::uint64_t>(kIndexMax) - data_offset) /
                                        core::dtype_size(dtype));
  Index prod = 1;
  for (Index d : shape) {
    if (__builtin_mul_overflow(prod, std::max<Index>(d, 1), &prod) || prod > limit) {
      return fmt::format("shape {} is too large: its bytes overflow int64", shape_repr(shape));
    }
  }
  return {};
}

void check_shape_for_write(const std::vector<Index>& shape, DType dtype, const std::string& path) {
  const std::string problem = shape_problem(shape, dtype, 1u << 20);
  if (!problem.empty()) bad_input(path, problem, "non-negative dimensions whose product fits in int64 bytes");
}

struct Preamble {
  int major = 0;
  std::size_t header_begin = 0;  // first byte of the dict text
  std::size_t header_len = 0;    // as stored; not yet checked against the file size
};

// Magic, version and header length; needs at most the first 12 bytes.
Preamble parse_preamble(std::string_view b, const std::string& name) {
  if (b.size() < kMagic.size()) {
    bad_input(name, fmt::format("file is {} bytes, shorter than the .npy magic", b.size()),
              "the 6-byte magic \\x93NUMPY");
  }
  if (b.substr(0, kMagic.size()) != kMagic) {
    bad_input(name, fmt::format("bad magic '{}', not a .npy file", printable(b.substr(0, kMagic.size()))),
              "'\\x93NUMPY'");
  }
  if (b.size() < 8) bad_input(name, "file ends inside the format version", "2 version bytes after the magic");
  Preamble p;
  p.major = static_cast<unsigned char>(b[6]);
  const int minor = static_cast<unsigned char>(b[7]);
  if (p.major < 1 || p.major > 3 || minor != 0) {
    bad_input(name, fmt::format("unsupported .npy format version {}.{}", p.major, minor), "1.0, 2.0 or 3.0");
  }
  // 1.0 stores the header length as a little-endian uint16, 2.0 and 3.0 as a uint32.
  const std::size_t len_bytes = p.major == 1 ? 2 : 4;
  p.header_begin = 8 + len_bytes;
  if (b.size() < p.header_begin) {
    bad_input(name, "file ends inside the header length", fmt::format("{} bytes of header length", len_bytes));
  }
  for (std::size_t i = 0; i < len_bytes; ++i) {
    p.header_len |= static_cast<std::size_t>(static_cast<unsigned char>(b[8 + i])) << (8 * i);
  }
  return p;
}

// The header text is a Python dict literal as numpy's repr writes it, e.g.
//   {'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }
// Only literals numpy can produce for our dtypes are accepted. Every step consumes input or
// throws, so the parser terminates, and every access is bounds-checked by peek().
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name, bool allow_long_suffix)
      : s_(text), name_(name), allow_long_suffix_(allow_long_suffix) {}

  void parse(NpyHeader& h) {
    bool seen_descr = false, seen_order = false, seen_shape = false;
    skip_ws();
    if (peek() != '{') syntax("'{' opening a dict");
    ++i_;
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      const std::string_view key = parse_string("a quoted key or '}'");
      skip_ws();
      if (peek() != ':') syntax(fmt::format("':' after key '{}'", printable(key)));
      ++i_;
      skip_ws();
      bool* seen = nullptr;
      if (key == "descr") {
        seen = &seen_descr;
        h.dtype = parse_descr();
      } else if (key == "fortran_order") {
        seen = &seen_order;
        parse_fortran_order();
      } else if (key == "shape") {
        seen = &seen_shape;
        h.shape = parse_shape();
      } else {
        bad_input(name_, fmt::format("unexpected header key '{}'", printable(key)),
                  "exactly the keys 'descr', 'fortran_order' and 'shape'");
      }
      if (*seen) bad_input(name_, fmt::format("duplicate header key '{}'", key), "each key once");
      *seen = true;
      skip_ws();
      if (peek() == ',') {
        ++i_;
      } else if (peek() != '}') {
        syntax("',' or '}' after a dict value");
      }
    }
    ++i_;  // '}'
    skip_ws();
    if (i_ < s_.size()) syntax("only spaces and a newline after the closing '}'");
    if (!seen_descr) bad_input(name_, "header has no 'descr' key", "keys 'descr', 'fortran_order' and 'shape'");
    if (!seen_order) {
      bad_input(name_, "header has no 'fortran_order' key", "keys 'descr', 'fortran_order' and 'shape'");
    }
    if (!seen_shape) bad_input(name_, "header has no 'shape' key", "keys 'descr', 'fortran_order' and 'shape'");
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_word(char c) {
    return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  void skip_ws() {
    while (i_ < s_.size() && is_ws(s_[i_])) ++i_;
  }

  [[noreturn]] void syntax(std::string_view expected) const {
    const std::string found = i_ < s_.size() ? fmt::format("'{}'", printable(s_.substr(i_), 16)) : "the end";
    bad_input(name_, fmt::format("header is not a valid Python dict literal: found {} at header byte {}", found, i_),
              expected);
  }

  // A plain '...' or "..." string; escapes never occur in what numpy writes for our keys.
  std::string_view parse_string(std::string_view expected) {
    const char q = peek();
    if (q != '\'' && q != '"') syntax(expected);
    const std::size_t begin = ++i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' || s_[i_] == '\n') syntax("a plain string without escapes or newlines");
      ++i_;
    }
    if (i_ >= s_.size()) syntax("a closing quote");
    return s_.substr(begin, i_++ - begin);
  }

  std::string_view parse_word() {
    const std::size_t begin = i_;
    while (i_ < s_.size() && is_word(s_[i_])) ++i_;
    return s_.substr(begin, i_ - begin);
  }

  DType parse_descr() {
    constexpr std::string_view expected = "'<f4' or '<f8', little-endian float32 or float64";
    if (peek() != '\'' && peek() != '"') {
      bad_input(name_, fmt::format("descr '{}' is not a simple type string", printable(s_.substr(i_), 16)), expected);
    }
    const std::string_view d = parse_string(expected);
    if (d == "<f4") return DType::f32;
    if (d == "<f8") return DType::f64;
    bad_input(name_, fmt::format("unsupported descr '{}'", printable(d)), expected);
  }

  void parse_fortran_order() {
    const std::size_t at = i_;
    const std::string_view w = parse_word();
    if (w == "False") return;
    if (w == "True") bad_input(name_, "fortran_order is True: Fortran-order data is not supported", "False, C order");
    bad_input(name_, fmt::format("fortran_order '{}' is not a bool", printable(s_.substr(at), 16)), "False");
  }

  Index parse_dim() {
    const std::size_t at = i_;
    const bool negative = peek() == '-';
    if (negative) ++i_;
    if (!is_digit(peek())) {
      bad_input(name_, fmt::format("shape dimension '{}' is not an integer", printable(s_.substr(at), 16)),
                "non-negative integers");
    }
    Index v = 0;
    bool overflow = false;
    while (is_digit(peek())) {
      const int digit = peek() - '0';
      if (v > (kIndexMax - digit) / 10) overflow = true;
      if (!overflow) v = v * 10 + digit;
      ++i_;
    }
    // Python 2 numpy wrote long ints as 3L; numpy still strips the suffix for versions 1.0/2.0.
    if (allow_long_suffix_ && (peek() == 'L' || peek() == 'l')) ++i_;
    const std::string_view text = s_.substr(at, i_ - at);
    if (is_word(peek()) || peek() == '.') {
      bad_input(name_, fmt::format("shape dimension '{}' is not an integer", printable(s_.substr(at), 16)),
                "non-negative integers");
    }
    if (negative) bad_input(name_, fmt::format("negative shape dimension {}", printable(text)), "non-negative integers");
    if (overflow) {
      bad_input(name_, fmt::format("shape dimension {} overflows int64", printable(text)), "at most 2^63-1");
    }
    return v;
  }

  // (), (5,), (2, 3) or (2, 3,): a tuple of integers; (5) is an int, not a tuple.
  std::vector<Index> parse_shape() {
    std::vector<Index> shape;
    if (peek() != '(') {
      bad_input(name_, fmt::format("shape '{}' is not a tuple", printable(s_.substr(i_), 16)),
                "a tuple such as (5,) or (2, 3)");
    }
    ++i_;
    skip_ws();
    bool trailing_comma = false;
    while (peek() != ')') {
      shape.push_back(parse_dim());
      skip_ws();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++i_;
        skip_ws();
      } else if (peek() != ')') {
        syntax("',' or ')' in the shape tuple");
      }
    }
    ++i_;  // ')'
    if (shape.size() == 1 && !trailing_comma) {
      bad_input(name_, fmt::format("shape ({}) is an integer, not a tuple", shape[0]), fmt::format("({},)", shape[0]));
    }
    return shape;
  }

  std::string_view s_;
  std::size_t i_ = 0;
  const std::string& name_;
  bool allow_long_suffix_;
};

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
      std::transform(stage.begin(), stage.begin() + n, dst + done, [](FileT x) { return static_cast<T>(x); });
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
      std::transform(src + done, src + done + n, stage.begin(), [](T x) { return static_cast<FileT>(x); });
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
  if (h.dtype == DType::f32) {
    run(static_cast<float*>(nullptr));
  } else {
    run(static_cast<double*>(nullptr));
  }
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
  if (dtype == DType::f32) {
    run(static_cast<float*>(nullptr));
  } else {
    run(static_cast<double*>(nullptr));
  }
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

Index NpyHeader::elements() const {
  Index n = 1;
  for (Index d : shape) n *= d;
  return n;
}

std::string npy_descr(DType dtype) { return dtype == DType::f32 ? "<f4" : "<f8"; }

std::string describe(DType dtype, const std::vector<Index>& shape) {
  return fmt::format("{} {}", npy_descr(dtype), shape_repr(shape));
}

NpyHeader parse_npy_header(std::string_view bytes, const std::string& name) {
  const Preamble p = parse_preamble(bytes, name);
  if (p.header_len > bytes.size() - p.header_begin) {
    bad_input(name,
              fmt::format("header length {} runs past the end of the file ({} bytes)", p.header_len, bytes.size()),
              fmt::format("a file of at least {} bytes", p.header_begin + p.header_len));
  }
  NpyHeader h;
  HeaderParser(bytes.substr(p.header_begin, p.header_len), name, p.major <= 2).parse(h);
  h.data_offset = p.header_begin + p.header_len;
  const std::string problem = shape_problem(h.shape, h.dtype, h.data_offset);
  if (!problem.empty()) bad_input(name, problem, "a tensor smaller than 2^63 bytes");
  return h;
}

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

std::string npy_header_bytes(DType dtype, const std::vector<Index>& shape) {
  check_shape_for_write(shape, dtype, "npy header");
  // numpy writes the keys sorted, each as "'key': repr(value), ", then "}".
  std::string dict =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", npy_descr(dtype), shape_repr(shape));
  if (!shape.empty()) dict.append(kGrowthAxisMaxDigits - fmt::formatted_size("{}", shape[0]), ' ');
  // Spaces and a final '\n' pad the header so the data starts on a 64-byte boundary; like
  // numpy, an already aligned length still gets a full 64 bytes of padding.
  const auto wrap = [&](std::size_t len_bytes) {
    const std::size_t prefix = kMagic.size() + 2 + len_bytes;
    const std::size_t pad = kArrayAlign - (prefix + dict.size() + 1) % kArrayAlign;
    const std::size_t header_len = dict.size() + pad + 1;
    std::string out(kMagic);
    out += static_cast<char>(len_bytes == 2 ? 1 : 2);
    out += '\0';
    for (std::size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((header_len >> (8 * i)) & 0xff);
    out += dict;
    out.append(pad, ' ');
    out += '\n';
    return std::pair{out, header_len};
  };
  auto [v1, len] = wrap(2);
  if (len <= 0xffff) return v1;
  return wrap(4).first;
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
#undef RINGATTN_NPY_INSTANTIATE

}  // namespace ringattn::io
