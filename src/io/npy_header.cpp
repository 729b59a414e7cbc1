// .npy headers: parsing and validation of any bytes (the parser is fuzzed), and the exact header
// numpy writes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <system_error>

#include "npy_detail.hpp"
#include "ringattn/core/errors.hpp"
#include "ringattn/io/npy.hpp"

namespace ringattn::io {

using core::DType;
using core::Index;

namespace detail {

using namespace std::string_view_literals;

constexpr std::string_view kMagic = "\x93NUMPY"sv;
constexpr Index kIndexMax = std::numeric_limits<Index>::max();
// numpy 1.24 `format.GROWTH_AXIS_MAX_DIGITS`: spaces left after the dict so axis 0 can grow in place.
constexpr std::size_t kGrowthAxisMaxDigits = 21;
constexpr std::size_t kArrayAlign = 64;  // numpy `format.ARRAY_ALIGN`

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
    constexpr std::string_view expected = "'<f2', '<f4' or '<f8', little-endian float16, float32 or float64";
    if (peek() != '\'' && peek() != '"') {
      bad_input(name_, fmt::format("descr '{}' is not a simple type string", printable(s_.substr(i_), 16)), expected);
    }
    const std::string_view d = parse_string(expected);
    if (d == "<f2") return DType::f16;
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

}  // namespace detail

using namespace detail;

std::string npy_descr(DType dtype) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::f16: return "<f2";
    case DType::bf16: break;
  }
  return "bf16";  // no numpy type: only named in messages, never written
}

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

Index NpyHeader::elements() const {
  Index n = 1;
  for (Index d : shape) n *= d;
  return n;
}

}  // namespace ringattn::io
