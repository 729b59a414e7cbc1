#pragma once
// A small JSON value and writer for the reports. Writing only.
//   - Objects keep insertion order, so reports read in the order the code builds them.
//   - Integers are stored as int64 and printed exactly; doubles are printed with the shortest
//     digits that round-trip, and with a ".0" when integral so Python reads them back as float.
//   - JSON has no inf/nan: non-finite doubles are written as null.
//   - Strings are escaped per RFC 8259; bytes that are not valid UTF-8 become U+FFFD.
#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ringattn::io {

class Json {
 public:
  Json() = default;  // null
  Json(bool v) : kind_(Kind::boolean), bool_(v) {}
  Json(double v) : kind_(Kind::number), number_(v) {}
  Json(std::int64_t v) : kind_(Kind::integer), integer_(v) {}
  Json(int v) : kind_(Kind::integer), integer_(v) {}
  // Other integer types (size_t, unsigned, long long, ...) without casts at call sites.
  // Unsigned values above 2^63-1 cannot be held exactly and are stored as a double.
  template <std::integral I>
    requires(!std::same_as<I, bool> && !std::same_as<I, std::int64_t> && !std::same_as<I, int>)
  Json(I v) {
    if constexpr (std::is_unsigned_v<I>) {
      if (static_cast<std::uint64_t>(v) > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        kind_ = Kind::number;
        number_ = static_cast<double>(v);
        return;
      }
    }
    kind_ = Kind::integer;
    integer_ = static_cast<std::int64_t>(v);
  }
  Json(const char* v) : kind_(Kind::string), string_(v) {}
  Json(std::string_view v) : kind_(Kind::string), string_(v) {}
  Json(std::string v) : kind_(Kind::string), string_(std::move(v)) {}

  static Json object();
  static Json array();

  bool is_null() const { return kind_ == Kind::null; }
  bool is_object() const { return kind_ == Kind::object; }
  bool is_array() const { return kind_ == Kind::array; }
  // Members of an object or elements of an array; 0 otherwise.
  std::size_t size() const;

  // Object: the value at key, inserted as null if absent. A null value becomes an empty object
  // first; any other kind throws std::logic_error.
  Json& operator[](const std::string& key);
  // Object: the value at key, or nullptr.
  const Json* find(const std::string& key) const;
  // Array: appends. A null value becomes an empty array first; any other kind throws std::logic_error.
  void push_back(Json v);
  // Object: the members in insertion order (empty for other kinds).
  const std::vector<std::pair<std::string, Json>>& members() const { return members_; }

  // indent >= 0: one member per line, nested by `indent` spaces; indent < 0: one line, no spaces.
  std::string dump(int indent = 2) const;

 private:
  enum class Kind { null, boolean, number, integer, string, array, object };
  void dump_to(std::string& out, int indent, int depth) const;

  Kind kind_ = Kind::null;
  bool bool_ = false;
  double number_ = 0.0;
  std::int64_t integer_ = 0;
  std::string string_;
  std::vector<Json> items_;                             // array
  std::vector<std::pair<std::string, Json>> members_;  // object, in insertion order
};

// `text` as a JSON string literal, quotes included (RFC 8259 escaping).
std::string json_quote(std::string_view text);

// Writes path + ".tmp.<pid>", flushes it to disk, then renames it over path, so a reader sees
// either the old file or the whole new one. Throws RuntimeFailure naming the path on failure
// (and removes the temporary file).
void write_text_atomically(const std::string& path, const std::string& text);

}  // namespace ringattn::io
