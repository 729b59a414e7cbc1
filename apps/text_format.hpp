#pragma once
// How the tables write sizes and times.
#include <fmt/format.h>

#include <string>

namespace ringattn::app {

// Binary units: "512 B", "4.00 KiB", "1.50 MiB"; `spec` formats the value and the unit past bytes.
inline std::string human_bytes(double b, const char* spec = "{:.2f} {}") {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format(fmt::runtime(spec), b, unit[u]);
}

inline std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

}  // namespace ringattn::app
