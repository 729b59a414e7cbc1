// gtest main for tests run under mpiexec: every rank runs every test; only rank 0 prints.
#include <gtest/gtest.h>

#include "ringattn/comm/comm.hpp"

int main(int argc, char** argv) {
  ringattn::comm::Environment env(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int result = 0;
  {
    const ringattn::comm::Comm world = ringattn::comm::Comm::world();
    if (world.rank() != 0) {
      auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
      delete listeners.Release(listeners.default_result_printer());
    }
    result = RUN_ALL_TESTS();
    // A failure on any rank fails the job on every rank.
    result = world.max(static_cast<double>(result)) > 0 ? 1 : 0;
  }
  return result;
}
