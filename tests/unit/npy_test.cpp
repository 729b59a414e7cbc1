// npy reading and writing: round trips of whole tensors and of shard position runs, byte
// compatibility with numpy's header format, and one-line InputErrors for malformed files.
#include "ringattn/io/npy.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ringattn/core/errors.hpp"

namespace ringattn::io {
namespace {

using core::DType;
using core::Index;

namespace fs = std::filesystem;

// A string literal with embedded NULs, all of it.
template <std::size_t N>
std::string bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

// numpy 1.24 `np.save` of np.arange(6.0).reshape(2, 3): the first 128 bytes, verbatim.
const std::string kNumpyHeaderF8x2x3 = bytes(
    "\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }"
    "                                                          \x0a");

// A header with our own dict text, framed like numpy frames it (version, length, padding).
std::string frame(const std::string& dict, int major = 1, std::size_t align = 64) {
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  const std::size_t prefix = 8 + len_bytes;
  std::size_t header_len = dict.size() + 1;
  header_len += (align - (prefix + header_len) % align) % align;
  std::string out = bytes("\x93NUMPY");
  out += static_cast<char>(major);
  out += '\0';
  for (std::size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((header_len >> (8 * i)) & 0xff);
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out += '\n';
  return out;
}

std::string f8_data(int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    const double v = i;
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  return out;
}

class NpyFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "npy_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write_file(const std::string& name, const std::string& content) const {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }

  fs::path dir_;
};

// Values exact in float, distinct per element, so any misplaced element shows.
template <class T>
std::vector<T> iota_values(Index n) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (Index i = 0; i < n; ++i) v[i] = static_cast<T>(0.25 * static_cast<double>(i) - 3.0);
  return v;
}

// Maximal runs of consecutive positions of one rank, in increasing order.
std::vector<core::Run> runs_of(const std::vector<Index>& positions) {
  std::vector<core::Run> runs;
  for (Index local = 0; local < static_cast<Index>(positions.size()); ++local) {
    const Index p = positions[local];
    if (!runs.empty() && runs.back().global_begin + runs.back().length == p) {
      ++runs.back().length;
    } else {
      runs.push_back({p, local, 1});
    }
  }
  return runs;
}

// S = 7 positions over N = 3 ranks in the three layouts (contiguous, striped, zigzag).
const std::vector<std::vector<std::vector<Index>>> kLayoutsS7N3 = {
    {{0, 1, 2}, {3, 4}, {5, 6}},  // contiguous
    {{0, 3, 6}, {1, 4}, {2, 5}},  // striped
    {{0, 1, 6}, {2, 5}, {3, 4}},  // zigzag: chunks [0,1] [2] [3] [4] [5] [6]
};

// The shard [outer, L, inner] of a full [outer, S, inner] tensor, by direct indexing.
template <class T>
std::vector<T> expected_shard(const std::vector<T>& full, Index outer, Index S, Index inner,
                              const std::vector<Index>& positions) {
  const auto L = static_cast<Index>(positions.size());
  std::vector<T> out(static_cast<std::size_t>(outer * L * inner));
  for (Index o = 0; o < outer; ++o)
    for (Index l = 0; l < L; ++l)
      for (Index i = 0; i < inner; ++i) out[(o * L + l) * inner + i] = full[(o * S + positions[l]) * inner + i];
  return out;
}

template <class T>
void check_whole_round_trip(const std::string& p, DType dtype) {
  const std::vector<Index> shape{2, 5, 3, 4};
  const auto data = iota_values<T>(2 * 5 * 3 * 4);
  write_npy<T>(p, dtype, shape, data.data());
  const NpyHeader h = read_npy_header(p);
  EXPECT_EQ(h.dtype, dtype);
  EXPECT_EQ(h.shape, shape);
  EXPECT_EQ(h.data_offset % 64, 0u);
  EXPECT_EQ(read_npy<T>(p, h), data);
}

TEST_F(NpyFiles, WholeTensorRoundTripF32IsExact) { check_whole_round_trip<float>(path("a.npy"), DType::f32); }

TEST_F(NpyFiles, WholeTensorRoundTripF64IsExact) { check_whole_round_trip<double>(path("a.npy"), DType::f64); }

TEST_F(NpyFiles, ZeroDimensionalAndEmptyTensorsRoundTrip) {
  const double scalar = 2.5;
  write_npy<double>(path("s.npy"), DType::f64, {}, &scalar);
  const NpyHeader s = read_npy_header(path("s.npy"));
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.elements(), 1);
  EXPECT_EQ(read_npy<double>(path("s.npy"), s), std::vector<double>{2.5});

  write_npy<float>(path("e.npy"), DType::f32, {0, 3}, nullptr);
  const NpyHeader e = read_npy_header(path("e.npy"));
  EXPECT_EQ(e.shape, (std::vector<Index>{0, 3}));
  EXPECT_TRUE(read_npy<float>(path("e.npy"), e).empty());
}

// q/k/v/o layout [B, S, H, D], positions on axis 1; every rank of every layout reads its shard.
TEST_F(NpyFiles, PositionRunsOnAxis1OfBSHDMatchDirectIndexing) {
  const Index B = 2, S = 7, H = 3, D = 2;
  const auto full = iota_values<float>(B * S * H * D);
  write_npy<float>(path("q.npy"), DType::f32, {B, S, H, D}, full.data());
  const NpyHeader h = read_npy_header(path("q.npy"));
  for (const auto& layout : kLayoutsS7N3) {
    for (const auto& positions : layout) {
      SCOPED_TRACE(::testing::PrintToString(positions));
      const auto L = static_cast<Index>(positions.size());
      const auto runs = runs_of(positions);
      std::vector<float> shard(static_cast<std::size_t>(B * L * H * D), -99.0f);
      read_npy_positions<float>(path("q.npy"), h, 1, runs, L, shard.data());
      EXPECT_EQ(shard, expected_shard(full, B, S, H * D, positions));
    }
  }
}

// lse layout [B, H, S], positions on the last axis (inner = 1), f64.
TEST_F(NpyFiles, PositionRunsOnAxis2OfBHSMatchDirectIndexing) {
  const Index B = 2, H = 3, S = 7;
  const auto full = iota_values<double>(B * H * S);
  write_npy<double>(path("lse.npy"), DType::f64, {B, H, S}, full.data());
  const NpyHeader h = read_npy_header(path("lse.npy"));
  for (const auto& layout : kLayoutsS7N3) {
    for (const auto& positions : layout) {
      SCOPED_TRACE(::testing::PrintToString(positions));
      const auto L = static_cast<Index>(positions.size());
      std::vector<double> shard(static_cast<std::size_t>(B * H * L), -99.0);
      read_npy_positions<double>(path("lse.npy"), h, 2, runs_of(positions), L, shard.data());
      EXPECT_EQ(shard, expected_shard(full, B * H, S, 1, positions));
    }
  }
}

// What `--out` does: one create_npy, then each rank pwrites its own runs (here in reverse rank
// order, so the result cannot depend on write order).
template <class T>
void check_sharded_write(const std::string& p, DType dtype, const std::vector<Index>& shape, int pos_axis) {
  Index outer = 1, inner = 1;
  for (int a = 0; a < pos_axis; ++a) outer *= shape[a];
  for (std::size_t a = pos_axis + 1; a < shape.size(); ++a) inner *= shape[a];
  const Index S = shape[pos_axis];
  const auto full = iota_values<T>(outer * S * inner);
  for (const auto& layout : kLayoutsS7N3) {
    create_npy(p, dtype, shape);
    for (auto rank = layout.rbegin(); rank != layout.rend(); ++rank) {
      const auto shard = expected_shard(full, outer, S, inner, *rank);
      write_npy_positions<T>(p, dtype, shape, pos_axis, runs_of(*rank), static_cast<Index>(rank->size()),
                             shard.data());
    }
    const NpyHeader h = read_npy_header(p);
    EXPECT_EQ(read_npy<T>(p, h), full);
  }
}

TEST_F(NpyFiles, ShardWritesFromAllRanksRebuildBSHDTensorF32) {
  check_sharded_write<float>(path("o.npy"), DType::f32, {2, 7, 3, 2}, 1);
}

TEST_F(NpyFiles, ShardWritesFromAllRanksRebuildBHSTensorF64) {
  check_sharded_write<double>(path("lse.npy"), DType::f64, {2, 3, 7}, 2);
}

TEST_F(NpyFiles, CreateNpyGivesZeroFilledDataOfFullSize) {
  create_npy(path("z.npy"), DType::f64, {3, 4});
  const NpyHeader h = read_npy_header(path("z.npy"));  // also checks the file size
  EXPECT_EQ(read_npy<double>(path("z.npy"), h), std::vector<double>(12, 0.0));
}

TEST_F(NpyFiles, F64FileReadsAsFloatRoundedLikeStaticCast) {
  const Index B = 1, S = 7, H = 2, D = 3;
  std::vector<double> full(static_cast<std::size_t>(B * S * H * D));
  for (std::size_t i = 0; i < full.size(); ++i) full[i] = 0.1 * static_cast<double>(i) + 1e-9;  // not exact in float
  write_npy<double>(path("k.npy"), DType::f64, {B, S, H, D}, full.data());
  const NpyHeader h = read_npy_header(path("k.npy"));
  std::vector<float> rounded(full.begin(), full.end());
  EXPECT_EQ(read_npy<float>(path("k.npy"), h), rounded);

  const std::vector<Index> positions{1, 2, 5};
  std::vector<float> shard(positions.size() * H * D);
  read_npy_positions<float>(path("k.npy"), h, 1, runs_of(positions), 3, shard.data());
  EXPECT_EQ(shard, expected_shard(rounded, B, S, H * D, positions));
}

TEST_F(NpyFiles, FloatDataWrittenToF64FileWidensExactly) {
  const auto data = iota_values<float>(10);
  write_npy<float>(path("w.npy"), DType::f64, {10}, data.data());
  const NpyHeader h = read_npy_header(path("w.npy"));
  EXPECT_EQ(h.dtype, DType::f64);
  EXPECT_EQ(read_npy<double>(path("w.npy"), h), std::vector<double>(data.begin(), data.end()));
}

TEST_F(NpyFiles, LargeConvertedReadCrossesStagingChunks) {
  // More elements than one 2^16-element staging chunk, with an odd tail.
  const Index n = (Index{1} << 17) + 3;
  const auto data = iota_values<double>(n);
  write_npy<double>(path("big.npy"), DType::f32, {n}, data.data());
  const NpyHeader h = read_npy_header(path("big.npy"));
  EXPECT_EQ(read_npy<double>(path("big.npy"), h), data);
}

TEST(NpyFormat, HeaderBytesEqualNumpySaveOutput) {
  EXPECT_EQ(kNumpyHeaderF8x2x3.size(), 128u);
  EXPECT_EQ(npy_header_bytes(DType::f64, {2, 3}), kNumpyHeaderF8x2x3);
  // np.save(np.zeros(5, np.float32)): 1-d tuples are spelled (5,).
  EXPECT_EQ(npy_header_bytes(DType::f32, {5}),
            frame("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }" + std::string(20, ' ')));
}

TEST_F(NpyFiles, ReadsFileWithNumpyHeaderBytes) {
  const std::string p = write_file("np.npy", kNumpyHeaderF8x2x3 + f8_data(6));
  const NpyHeader h = read_npy_header(p);
  EXPECT_EQ(h.dtype, DType::f64);
  EXPECT_EQ(h.shape, (std::vector<Index>{2, 3}));
  EXPECT_EQ(h.data_offset, 128u);
  EXPECT_EQ(read_npy<double>(p, h), (std::vector<double>{0, 1, 2, 3, 4, 5}));
}

TEST(NpyFormat, AcceptsEveryPythonSpellingNumpyMayProduce) {
  const std::vector<std::string> headers = {
      frame("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }"),
      frame("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3)}"),        // no trailing comma
      frame("{'descr':'<f8','fortran_order':False,'shape':(2,3,),}"),           // no spaces, tuple comma
      frame("{\"shape\": (2, 3), \"fortran_order\": False, \"descr\": \"<f8\"}"), // other order, " quotes
      frame("  {  'descr' : '<f8' ,\n 'fortran_order' : False ,\t'shape' : ( 2 , 3 ) , }  "),
      frame("{'descr': '<f8', 'fortran_order': False, 'shape': (2L, 3L), }"),   // Python 2 numpy
      frame("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 1, 16),  // numpy < 1.14 alignment
      frame("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 2),
      frame("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 3),
  };
  for (const auto& header : headers) {
    SCOPED_TRACE(header);
    const NpyHeader h = parse_npy_header(header + f8_data(6), "t.npy");
    EXPECT_EQ(h.dtype, DType::f64);
    EXPECT_EQ(h.shape, (std::vector<Index>{2, 3}));
    EXPECT_EQ(h.data_offset, header.size());
  }
  EXPECT_EQ(parse_npy_header(frame("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }"), "t").shape,
            std::vector<Index>{5});
  EXPECT_TRUE(parse_npy_header(frame("{'descr': '<f4', 'fortran_order': False, 'shape': (), }"), "t").shape.empty());
}

TEST(NpyFormat, WritesVersion2WhenHeaderExceeds64KiB) {
  // 30000 dimensions of 1 give a dict longer than a uint16 length can hold.
  const std::vector<Index> shape(30000, 1);
  const std::string header = npy_header_bytes(DType::f32, shape);
  EXPECT_EQ(header[6], '\x02');
  EXPECT_EQ(header.size() % 64, 0u);
  const NpyHeader h = parse_npy_header(header + std::string(4, '\0'), "wide.npy");
  EXPECT_EQ(h.shape, shape);
  EXPECT_EQ(h.data_offset, header.size());
}

// Each malformed file must give InputError: one line, naming the file, saying what was expected.
struct BadFile {
  const char* label;
  std::string content;
  const char* says;  // a fragment the message must contain
};

std::vector<BadFile> bad_files() {
  const std::string ok_dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
  const auto with_dict = [](const std::string& dict) { return frame(dict) + f8_data(6); };
  return {
      {"empty file", "", "shorter than the .npy magic"},
      {"shorter than magic", bytes("\x93NUM"), "shorter than the .npy magic"},
      {"bad magic (zip)", bytes("PK\x03\x04\x14\x00\x00\x00\x08\x00"), "bad magic"},
      {"version 4.0", bytes("\x93NUMPY\x04\x00\x10\x00{}"), "unsupported .npy format version 4.0"},
      {"version 1.1", bytes("\x93NUMPY\x01\x01\x10\x00{}"), "unsupported .npy format version 1.1"},
      {"ends in version", bytes("\x93NUMPY\x01"), "inside the format version"},
      {"ends in header length", bytes("\x93NUMPY\x02\x00\x10\x00"), "inside the header length"},
      {"header length past end", bytes("\x93NUMPY\x01\x00\xff\x7f{'descr': '<f8'}"), "runs past the end"},
      {"header is a list", with_dict("[('descr', '<f8')]"), "not a valid Python dict literal"},
      {"unterminated dict", with_dict("{'descr': '<f8', 'fortran_order': False"), "not a valid Python dict literal"},
      {"unterminated string", with_dict("{'descr: '<f8'}"), "not a valid Python dict literal"},
      {"garbage after dict", with_dict(ok_dict + " x"), "not a valid Python dict literal"},
      {"missing shape", with_dict("{'descr': '<f8', 'fortran_order': False, }"), "no 'shape' key"},
      {"missing descr", with_dict("{'fortran_order': False, 'shape': (2, 3), }"), "no 'descr' key"},
      {"duplicate descr", with_dict("{'descr': '<f8', 'descr': '<f8', 'fortran_order': False, 'shape': (2, 3)}"),
       "duplicate header key 'descr'"},
      {"extra key", with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), 'x': 1}"),
       "unexpected header key 'x'"},
      {"big-endian descr", with_dict("{'descr': '>f8', 'fortran_order': False, 'shape': (2, 3), }"),
       "unsupported descr '>f8'"},
      {"native-order descr", with_dict("{'descr': '=f4', 'fortran_order': False, 'shape': (2, 3), }"),
       "expected '<f2', '<f4' or '<f8'"},
      {"bool descr", with_dict("{'descr': '|b1', 'fortran_order': False, 'shape': (2, 3), }"),
       "unsupported descr '|b1'"},
      {"complex descr", with_dict("{'descr': '<c8', 'fortran_order': False, 'shape': (2, 3), }"),
       "unsupported descr '<c8'"},
      {"integer descr", with_dict("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }"),
       "unsupported descr '<i8'"},
      {"structured descr", with_dict("{'descr': [('a', '<f8')], 'fortran_order': False, 'shape': (2, 3), }"),
       "not a simple type string"},
      {"fortran order", with_dict("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }"),
       "fortran_order is True"},
      {"fortran_order not bool", with_dict("{'descr': '<f8', 'fortran_order': 0, 'shape': (2, 3), }"),
       "is not a bool"},
      {"negative dimension", with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (-2, 3), }"),
       "negative shape dimension -2"},
      {"float dimension", with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (2.0, 3), }"),
       "is not an integer"},
      {"shape not a tuple", with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (6), }"),
       "is an integer, not a tuple"},
      {"shape is a list", with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': [2, 3], }"),
       "is not a tuple"},
      {"dimension overflows int64",
       with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }"), "overflows int64"},
      {"byte count overflows int64",
       with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }"),
       "too large"},
      {"truncated data", frame(ok_dict) + f8_data(5), "data is truncated"},
      {"trailing bytes", frame(ok_dict) + f8_data(6) + "x", "1 trailing bytes"},
  };
}

TEST_F(NpyFiles, MalformedFilesThrowOneLineInputErrorNamingTheFile) {
  const auto cases = bad_files();
  ASSERT_GE(cases.size(), 15u);
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].label);
    const std::string p = write_file("bad" + std::to_string(i) + ".npy", cases[i].content);
    try {
      read_npy_header(p);
      ADD_FAILURE() << "accepted";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(p + ": ", 0), 0u) << msg;
      EXPECT_NE(msg.find(cases[i].says), std::string::npos) << msg;
      EXPECT_NE(msg.find("(expected "), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

TEST_F(NpyFiles, MissingFileAndDirectoryThrowInputErrorNamingThePath) {
  for (const std::string& p : {path("absent.npy"), dir_.string()}) {
    try {
      read_npy_header(p);
      ADD_FAILURE() << "accepted " << p;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
    }
  }
}

// A small stand-in for the libFuzzer target: every prefix and many random mutations of valid
// files either parse or throw InputError (ASan/UBSan builds also check the bounds).
TEST(NpyFormat, ParserOnlyEverThrowsInputErrorOnCorruptBytes) {
  const std::vector<std::string> seeds = {
      kNumpyHeaderF8x2x3,
      frame("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 2),
      frame("{\"descr\":\"<f8\",\"fortran_order\":False,\"shape\":(1L,2L,3L,)}"),
  };
  std::mt19937 rng(12345);
  const auto check = [](const std::string& b) {
    try {
      const NpyHeader h = parse_npy_header(b, "fuzz.npy");
      EXPECT_LE(h.data_offset, b.size());
    } catch (const InputError&) {
    } catch (...) {
      ADD_FAILURE() << "non-InputError for " << ::testing::PrintToString(b);
    }
  };
  for (const auto& seed : seeds) {
    for (std::size_t n = 0; n <= seed.size(); ++n) check(seed.substr(0, n));
    for (int trial = 0; trial < 3000; ++trial) {
      std::string b = seed;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<char>(rng() % 256);
      check(b);
    }
  }
}

TEST_F(NpyFiles, RunOutsideTheFileIsInputError) {
  const auto data = iota_values<float>(2 * 7);
  write_npy<float>(path("x.npy"), DType::f32, {2, 7}, data.data());
  const NpyHeader h = read_npy_header(path("x.npy"));
  std::vector<float> out(8);
  const std::vector<core::Run> past_end{{5, 0, 4}};
  EXPECT_THROW(read_npy_positions<float>(path("x.npy"), h, 1, past_end, 4, out.data()), InputError);
  const std::vector<core::Run> ok{{0, 0, 2}};
  EXPECT_THROW(read_npy_positions<float>(path("x.npy"), h, 2, ok, 2, out.data()), InputError);  // no axis 2
}

TEST_F(NpyFiles, WriteFailuresThrowRuntimeFailureNamingThePath) {
  const std::string missing_dir = path("no/such/dir/o.npy");
  try {
    create_npy(missing_dir, DType::f32, {2, 3});
    ADD_FAILURE() << "created";
  } catch (const RuntimeFailure& e) {
    EXPECT_EQ(std::string(e.what()).rfind(missing_dir + ": ", 0), 0u) << e.what();
  }
  // Positions written with another shape than the file was created with.
  create_npy(path("o.npy"), DType::f32, {2, 3});
  const std::vector<float> data(4, 1.0f);
  const std::vector<core::Run> runs{{0, 0, 2}};
  EXPECT_THROW(write_npy_positions<float>(path("o.npy"), DType::f32, {2, 4}, 1, runs, 2, data.data()),
               RuntimeFailure);
  EXPECT_THROW(write_npy_positions<float>(path("o.npy"), DType::f64, {2, 3}, 1, runs, 2, data.data()),
               RuntimeFailure);
}

}  // namespace
}  // namespace ringattn::io
