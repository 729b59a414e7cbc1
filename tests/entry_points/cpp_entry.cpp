// One attention call through the C++ API (ringattn/ringattn.hpp), for entry_points_test.py: the
// options come as key=value arguments named as in the Python package; every rank builds the plan,
// loads zeros of its shard's size and runs the forward. Rank 0 prints "accepted" or "error: MSG"
// (the InputError's message); the exit code is 0 or 2.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ringattn/ringattn.hpp"

namespace {

std::vector<ringattn::Index> ints(const std::string& csv) {
  std::vector<ringattn::Index> v;
  for (std::size_t at = 0; at < csv.size();) {
    const std::size_t comma = csv.find(',', at);
    v.push_back(std::stoll(csv.substr(at, comma - at)));
    at = comma == std::string::npos ? csv.size() : comma + 1;
  }
  return v;
}

// "0.5,-inf,nan" -> {0.5, -inf, nan} (strtod reads inf and nan).
std::vector<double> doubles(const std::string& csv) {
  std::vector<double> v;
  for (std::size_t at = 0; at < csv.size();) {
    const std::size_t comma = csv.find(',', at);
    v.push_back(std::strtod(csv.substr(at, comma - at).c_str(), nullptr));
    at = comma == std::string::npos ? csv.size() : comma + 1;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ringattn::AttentionOptions o;
  o.shape = {1, 16, 4, 4, 8};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::size_t eq = arg.find('=');
    const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);
    if (key == "seq") o.shape.S = std::stoll(value);
    else if (key == "batch") o.shape.B = std::stoll(value);
    else if (key == "heads") o.shape.H = std::stoll(value);
    else if (key == "kv_heads") o.shape.HKV = std::stoll(value);
    else if (key == "head_dim") o.shape.D = std::stoll(value);
    else if (key == "dtype") o.dtype = value;
    else if (key == "causal") o.causal = value == "1";
    else if (key == "window") o.window = std::stoll(value);
    else if (key == "doc_lens") o.doc_lens = ints(value);
    else if (key == "layout") o.layout = value;
    else if (key == "partition") o.partition = ints(value);
    else if (key == "scale") o.scale = std::stod(value);
    else if (key == "rope") o.rope_theta = std::stod(value);
    else if (key == "strategy") o.strategy = value;
    else if (key == "ulysses_degree") o.ulysses_degree = std::stoi(value);
    else if (key == "timeout") o.timeout_s = std::stod(value);
    else if (key == "softcap") o.softcap = std::stod(value);
    else if (key == "precision") o.precision = value;
    else if (key == "cu_seqlens") o.cu_seqlens = ints(value);
    else if (key == "sinks") o.sinks = doubles(value);
    else {
      std::fprintf(stderr, "cpp_entry: unknown key '%s'\n", key.c_str());
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  }
  int code = 0;
  try {
    ringattn::Attention att(ringattn::communicator(MPI_COMM_WORLD), o);
    const ringattn::core::Shape& s = o.shape;
    const ringattn::Index L = att.local_size();
    ringattn::core::with_storage(att.dtype(), [&]<class S>() {
      const std::vector<S> q(s.B * L * s.H * s.D), kv(s.B * L * s.HKV * s.D);
      att.load(std::span<const S>(q), std::span<const S>(kv), std::span<const S>(kv));
    });
    att.forward();
    if (rank == 0) std::printf("accepted\n");
  } catch (const ringattn::InputError& e) {
    if (rank == 0) std::printf("error: %s\n", e.what());
    code = 2;
  }
  MPI_Finalize();
  return code;
}
