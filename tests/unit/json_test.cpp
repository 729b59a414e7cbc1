// The report writer: layout of nested values, RFC 8259 escaping, exact integers, round-trip
// doubles, null for non-finite values, and atomic replacement of the report file.
#include "ringattn/io/json.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include "ringattn/core/errors.hpp"

namespace ringattn::io {
namespace {

namespace fs = std::filesystem;

TEST(Json, DumpsNestedObjectsAndArraysInInsertionOrder) {
  Json report = Json::object();
  report["config"]["seq"] = 5;
  report["config"]["layout"] = "zigzag";
  report["loss"] = 0.5;
  Json ranks = Json::array();
  Json r0 = Json::object();
  r0["rank"] = 0;
  r0["ok"] = true;
  ranks.push_back(r0);
  ranks.push_back(Json());
  report["ranks"] = ranks;
  report["empty"] = Json::array();
  report["config"]["seq"] = 7;  // overwrite keeps the member's place

  EXPECT_EQ(report.dump(),
            "{\n"
            "  \"config\": {\n"
            "    \"seq\": 7,\n"
            "    \"layout\": \"zigzag\"\n"
            "  },\n"
            "  \"loss\": 0.5,\n"
            "  \"ranks\": [\n"
            "    {\n"
            "      \"rank\": 0,\n"
            "      \"ok\": true\n"
            "    },\n"
            "    null\n"
            "  ],\n"
            "  \"empty\": []\n"
            "}");
  EXPECT_EQ(report.dump(-1),
            R"({"config":{"seq":7,"layout":"zigzag"},"loss":0.5,"ranks":[{"rank":0,"ok":true},null],"empty":[]})");
  EXPECT_EQ(report.size(), 4u);
  ASSERT_NE(report.find("loss"), nullptr);
  EXPECT_EQ(report.find("absent"), nullptr);
}

TEST(Json, EscapesStringsPerRfc8259) {
  EXPECT_EQ(Json("a\"b\\c/d").dump(), R"("a\"b\\c/d")");
  EXPECT_EQ(Json("\b\f\n\r\t").dump(), R"("\b\f\n\r\t")");
  EXPECT_EQ(Json(std::string("\x01\x1f\x00", 3)).dump(), R"("\u0001\u001f\u0000")");
  // Keys are escaped too.
  Json o = Json::object();
  o["k\"ey"] = 1;
  EXPECT_EQ(o.dump(-1), R"({"k\"ey":1})");
}

TEST(Json, PassesValidUtf8AndReplacesInvalidBytes) {
  EXPECT_EQ(Json("\xce\xbc-\xe2\x88\x9e-\xf0\x9f\x99\x82").dump(), "\"\xce\xbc-\xe2\x88\x9e-\xf0\x9f\x99\x82\"");
  EXPECT_EQ(Json("a\xff" "b").dump(), R"("a\ufffdb")");
  EXPECT_EQ(Json("\xc0\xaf").dump(), R"("\ufffd\ufffd")");           // overlong '/'
  EXPECT_EQ(Json("\xed\xa0\x80").dump(), R"("\ufffd\ufffd\ufffd")");  // UTF-16 surrogate
  EXPECT_EQ(Json("\xe2\x88").dump(), R"("\ufffd\ufffd")");            // truncated sequence
}

TEST(Json, NonFiniteDoublesAreWrittenAsNull) {
  Json a = Json::array();
  a.push_back(std::numeric_limits<double>::infinity());
  a.push_back(-std::numeric_limits<double>::infinity());
  a.push_back(std::nan(""));
  a.push_back(1.5);
  EXPECT_EQ(a.dump(-1), "[null,null,null,1.5]");
}

TEST(Json, Int64ValuesArePrintedExactly) {
  Json a = Json::array();
  a.push_back(std::numeric_limits<std::int64_t>::max());
  a.push_back(std::numeric_limits<std::int64_t>::min());
  a.push_back(std::int64_t{9007199254740993});  // 2^53 + 1: not representable as a double
  a.push_back(std::size_t{42});
  a.push_back(-7);
  EXPECT_EQ(a.dump(-1), "[9223372036854775807,-9223372036854775808,9007199254740993,42,-7]");
}

TEST(Json, DoublesRoundTripAndIntegralDoublesStayFloats) {
  for (double v : {0.1, 1.0 / 3.0, -2.5e-300, 6.02214076e23, 1e300, std::numeric_limits<double>::denorm_min(),
                   std::numeric_limits<double>::max(), 123456789.123456789}) {
    const std::string text = Json(v).dump();
    EXPECT_EQ(std::strtod(text.c_str(), nullptr), v) << text;
  }
  EXPECT_EQ(Json(3.0).dump(), "3.0");
  EXPECT_EQ(Json(-0.0).dump(), "-0.0");
  EXPECT_EQ(Json(0.1).dump(), "0.1");  // shortest digits, not %.17g's 0.10000000000000001
  EXPECT_EQ(Json(1e20).dump(), "1e+20");
}

TEST(Json, IndexingAScalarIsALogicError) {
  Json n = 3;
  EXPECT_THROW(n["x"], std::logic_error);
  EXPECT_THROW(n.push_back(1), std::logic_error);
  Json null_becomes_array;
  null_becomes_array.push_back(1);
  EXPECT_EQ(null_becomes_array.dump(-1), "[1]");
}

class JsonFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "json_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  fs::path dir_;
};

TEST_F(JsonFiles, AtomicWriteReplacesTheFileAndLeavesNoTmp) {
  const fs::path p = dir_ / "report.json";
  write_text_atomically(p.string(), "{\"old\": 1}\n");
  write_text_atomically(p.string(), "{\"new\": 2}\n");
  EXPECT_EQ(slurp(p), "{\"new\": 2}\n");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"report.json"});
}

TEST_F(JsonFiles, AtomicWriteIntoMissingDirectoryThrowsRuntimeFailureNamingThePath) {
  const std::string p = (dir_ / "missing" / "report.json").string();
  try {
    write_text_atomically(p, "{}");
    ADD_FAILURE() << "wrote";
  } catch (const RuntimeFailure& e) {
    EXPECT_EQ(std::string(e.what()).rfind(p + ": ", 0), 0u) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(JsonFiles, AtomicWriteOverADirectoryFailsAndRemovesItsTmp) {
  const fs::path p = dir_ / "taken";
  fs::create_directory(p);
  EXPECT_THROW(write_text_atomically(p.string(), "{}"), RuntimeFailure);  // rename onto a directory
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"taken"});
}

}  // namespace
}  // namespace ringattn::io
