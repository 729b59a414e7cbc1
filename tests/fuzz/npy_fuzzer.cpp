// libFuzzer target for the .npy reader (io/npy.hpp), built with clang++
// -fsanitize=fuzzer,address,undefined. Each input is a whole file:
//   1. parse_npy_header on the bytes: it must return a header or throw InputError, nothing else;
//   2. the same bytes as a file (memfd) through read_npy_header, which also checks the size;
//   3. when that accepts the file, the data through read_npy and read_npy_positions (bounded by
//      the input size, since read_npy_header checked the file holds exactly that much data).
// Any other exception, a crash, a leak or undefined behaviour is a finding.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "ringattn/core/errors.hpp"
#include "ringattn/io/npy.hpp"

namespace {

using ringattn::InputError;
namespace io = ringattn::io;
namespace core = ringattn::core;

// A header that parse_npy_header accepted must describe the bytes consistently.
void check_header(const io::NpyHeader& h, std::size_t input_size) {
  if (h.data_offset < 10 || h.data_offset > input_size) std::abort();
  for (core::Index d : h.shape)
    if (d < 0) std::abort();
}

void exercise_file(std::string_view bytes) {
  const int fd = memfd_create("npy_fuzz", MFD_CLOEXEC);
  if (fd < 0) return;
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    const io::NpyHeader h = io::read_npy_header(path);
    check_header(h, bytes.size());
    if (h.data_offset + h.data_bytes() != bytes.size()) std::abort();  // read_npy_header's promise
    const std::vector<double> all = io::read_npy<double>(path, h);
    if (all.size() != static_cast<std::size_t>(h.elements())) std::abort();
    if (h.shape.size() >= 2 && h.shape[1] >= 2) {
      // The odd positions of axis 1, as a striped shard would read them. A file with no elements
      // may still declare a huge axis 1 (say (0, 9239223232)), so ask for at most 4096 of them:
      // the harness must not be the thing that runs out of memory.
      std::vector<core::Run> runs;
      core::Index L = 0;
      const core::Index S = std::min<core::Index>(h.shape[1], 8192);
      for (core::Index p = 1; p < S; p += 2) runs.push_back({p, L++, 1});
      std::vector<float> shard(static_cast<std::size_t>(h.elements() / h.shape[1] * L));
      io::read_npy_positions<float>(path, h, 1, runs, L, shard.data());
    }
  } catch (const InputError&) {
  }
  ::close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    check_header(io::parse_npy_header(bytes, "fuzz.npy"), size);
  } catch (const InputError& e) {
    // One line, as the contract says.
    if (std::string_view(e.what()).find('\n') != std::string_view::npos) std::abort();
  }
  exercise_file(bytes);
  return 0;
}
