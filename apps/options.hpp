#pragma once
// Option values parsed strictly: an integer beyond its type's range is an error naming the option,
// never a silently saturated value.
#include "cli.hpp"
#include "ringattn/runtime/plan.hpp"
#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace ringattn::app {

template <class T>
CLI::Validator integer() {
  static_assert(std::is_integral_v<T>);
  return CLI::Validator(
      [](std::string& text) -> std::string {
        T v{};
        const char* end = text.data() + text.size();
        const char* begin = text.data() + (!text.empty() && text[0] == '+' ? 1 : 0);
        const auto [ptr, ec] = std::from_chars(begin, end, v);
        const bool signs = begin != text.data() && begin != end && *begin == '-';  // "+-5"
        if (ec == std::errc() && ptr == end && begin != end && !signs) {
          text = std::to_string(v);  // CLI11 converts with base 0, which reads "010" as 8
          return {};
        }
        return fmt::format("'{}' is not an integer in {}..{}", text, std::numeric_limits<T>::min(),
                           std::numeric_limits<T>::max());
      },
      "INTEGER");
}

// add_option with the strict integer check for integral targets (and their vectors and optionals).
// The check is a transform: it hands CLI11 the value in canonical decimal.
template <class T>
CLI::Option* add_integer(CLI::App* app, const std::string& name, T& target, const std::string& help) {
  using V = typename std::decay_t<T>;
  CLI::Option* o = app->add_option(name, target, help);
  if constexpr (std::is_integral_v<V>) o->transform(integer<V>());
  else o->transform(integer<typename V::value_type>());
  return o;
}

// A path option: an empty value is an error, never "not given" (a shell variable that expanded to
// nothing would otherwise run without the file the user meant). kind: "DIR" or "FILE".
inline CLI::Option* add_path(CLI::App* app, const std::string& name, std::string& target, const std::string& help,
                             const char* kind) {
  const std::string what = std::string_view(kind) == "DIR" ? "directory" : "file";
  return app->add_option(name, target, help)
      ->check(CLI::Validator(
          [what](std::string& text) -> std::string {
            return text.empty() ? fmt::format("'' is an empty path (expected a {} name)", what) : std::string{};
          },
          kind));
}

// The items of a comma-separated list ("a,b,c"; "" is one empty item).
inline std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items(1);
  for (const char ch : text) {
    if (ch == ',') items.emplace_back();
    else items.back() += ch;
  }
  return items;
}

// A list option, a,b,c, given once. CLI11 joins the values of a repeated vector option (--partition
// 2 --partition 3 would run as 2,3), so the list is taken as one text, which a second occurrence
// makes an error as it does for any other option, and split here; integer items get the strict check.
template <class T>
CLI::Option* add_list(CLI::App* app, const std::string& name, std::vector<T>& target, const std::string& help) {
  CLI::Option* o = app->add_option_function<std::string>(
      name,
      [&target](const std::string& text) {
        target.clear();
        for (const std::string& item : split_list(text)) {
          if constexpr (std::is_integral_v<T>) {
            T v{};
            std::from_chars(item.data() + (!item.empty() && item[0] == '+' ? 1 : 0), item.data() + item.size(), v);
            target.push_back(v);  // the check below has accepted every item
          } else {
            target.push_back(item);
          }
        }
      },
      help);
  if constexpr (std::is_integral_v<T>)
    o->check(CLI::Validator(
        [](std::string& text) -> std::string {
          for (std::string item : split_list(text))
            if (std::string why = integer<T>()(item); !why.empty()) return why;
          return {};
        },
        "INTEGER,..."));
  else
    o->check(CLI::Validator(
        [](std::string& text) -> std::string {
          for (const std::string& item : split_list(text))
            if (item.empty()) return fmt::format("'{}' has an empty item (expected a,b,...)", text);
          return {};
        },
        "TEXT,..."));
  return o;
}

// The shape options `run` and `probe` share (their configs name the fields alike), and --dtype with
// the command's own help.
template <class Config>
void add_shape_options(CLI::App* app, Config& c, const std::string& dtype_help) {
  using namespace runtime;  // the defaults the plan applies
  add_integer(app, "--seq", c.seq, fmt::format("total positions S (default {})", kDefaultSeq));
  add_integer(app, "--batch", c.batch, fmt::format("batch B (default {})", kDefaultBatch));
  add_integer(app, "--heads", c.heads, fmt::format("query heads H (default {})", kDefaultHeads));
  add_integer(app, "--kv-heads", c.kv_heads, "key/value heads HKV, H % HKV == 0 (default H)");
  add_integer(app, "--head-dim", c.head_dim, fmt::format("head dim D (default {})", kDefaultHeadDim));
  app->add_option("--dtype", c.dtype, dtype_help);
}

}  // namespace ringattn::app
