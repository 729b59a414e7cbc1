#include "ringattn/io/json.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <stdexcept>
#include <system_error>

#include "ringattn/core/errors.hpp"

namespace ringattn::io {

Json Json::object() {
  Json j;
  j.kind_ = Kind::object;
  return j;
}

Json Json::array() {
  Json j;
  j.kind_ = Kind::array;
  return j;
}

std::size_t Json::size() const {
  if (kind_ == Kind::object) return members_.size();
  if (kind_ == Kind::array) return items_.size();
  return 0;
}

Json& Json::operator[](const std::string& key) {
  if (kind_ == Kind::null) kind_ = Kind::object;
  if (kind_ != Kind::object) throw std::logic_error("Json::operator[]: value is not an object");
  // Linear search: report objects have a handful of members, and order must be kept.
  for (auto& [k, v] : members_) {
    if (k == key) return v;
  }
  members_.emplace_back(key, Json());
  return members_.back().second;
}

const Json* Json::find(const std::string& key) const {
  for (const auto& [k, v] : members_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Json::push_back(Json v) {
  if (kind_ == Kind::null) kind_ = Kind::array;
  if (kind_ != Kind::array) throw std::logic_error("Json::push_back: value is not an array");
  items_.push_back(std::move(v));
}

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is not one (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF).
std::size_t utf8_sequence(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const auto cont = [&](std::size_t k, unsigned lo = 0x80, unsigned hi = 0xbf) {
    return k < s.size() && b(k) >= lo && b(k) <= hi;
  };
  const unsigned c = b(i);
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return cont(i + 1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    const unsigned lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    return cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    const unsigned lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    return cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

void append_number(std::string& out, double v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  // Shortest digits that parse back to the same double (what %.17g guarantees, without the
  // noise digits).
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  const std::string_view text(buf, ec == std::errc() ? static_cast<std::size_t>(end - buf) : 0);
  out += text;
  if (text.find_first_of(".e") == std::string_view::npos) out += ".0";
}

void newline(std::string& out, int indent, int depth) {
  if (indent < 0) return;
  out += '\n';
  out.append(static_cast<std::size_t>(indent) * static_cast<std::size_t>(depth), ' ');
}

}  // namespace

std::string json_quote(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    switch (c) {
      case '"': out += "\\\""; ++i; continue;
      case '\\': out += "\\\\"; ++i; continue;
      case '\b': out += "\\b"; ++i; continue;
      case '\f': out += "\\f"; ++i; continue;
      case '\n': out += "\\n"; ++i; continue;
      case '\r': out += "\\r"; ++i; continue;
      case '\t': out += "\\t"; ++i; continue;
      default: break;
    }
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
      ++i;
      continue;
    }
    const std::size_t n = utf8_sequence(text, i);
    if (n == 0) {
      out += "\\ufffd";  // invalid UTF-8 byte: JSON text must be Unicode
      ++i;
      continue;
    }
    out.append(text.substr(i, n));
    i += n;
  }
  out += '"';
  return out;
}

void Json::dump_to(std::string& out, int indent, int depth) const {
  switch (kind_) {
    case Kind::null: out += "null"; return;
    case Kind::boolean: out += bool_ ? "true" : "false"; return;
    case Kind::integer: out += fmt::format("{}", integer_); return;
    case Kind::number: append_number(out, number_); return;
    case Kind::string: out += json_quote(string_); return;
    case Kind::array: {
      if (items_.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < items_.size(); ++i) {
        if (i > 0) out += ',';
        newline(out, indent, depth + 1);
        items_[i].dump_to(out, indent, depth + 1);
      }
      newline(out, indent, depth);
      out += ']';
      return;
    }
    case Kind::object: {
      if (members_.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (std::size_t i = 0; i < members_.size(); ++i) {
        if (i > 0) out += ',';
        newline(out, indent, depth + 1);
        out += json_quote(members_[i].first);
        out += indent < 0 ? ":" : ": ";
        members_[i].second.dump_to(out, indent, depth + 1);
      }
      newline(out, indent, depth);
      out += '}';
      return;
    }
  }
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out;
}

void write_text_atomically(const std::string& path, const std::string& text) {
  // The pid keeps concurrent writers (e.g. several ranks by mistake) off each other's temp file.
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const auto fail = [&](std::string_view what, int err) {
    ::unlink(tmp.c_str());
    throw RuntimeFailure(fmt::format("{}: {}: {}", path, what, std::system_category().message(err)));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    throw RuntimeFailure(fmt::format("{}: cannot create {}: {}", path, tmp, std::system_category().message(err)));
  }
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t put = ::write(fd, text.data() + done, text.size() - done);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) {
      const int err = put < 0 ? errno : ENOSPC;
      ::close(fd);
      fail(fmt::format("cannot write {}", tmp), err);
    }
    done += static_cast<std::size_t>(put);
  }
  // Data on disk before the rename, so a crash cannot leave a complete-looking empty file.
  // EINVAL: the file system does not support fsync (e.g. some pseudo file systems); nothing to flush.
  if (::fsync(fd) != 0 && errno != EINVAL) {
    const int err = errno;
    ::close(fd);
    fail(fmt::format("cannot flush {}", tmp), err);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    fail(fmt::format("cannot close {}", tmp), err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    fail(fmt::format("cannot rename {} to it", tmp), err);
  }
}

}  // namespace ringattn::io
