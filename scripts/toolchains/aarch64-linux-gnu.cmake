# Cross build for 64-bit Arm Linux with Debian's g++-aarch64-linux-gnu and the arm64 packages of
# the core's dependencies (dpkg --add-architecture arm64; libhwy-dev:arm64, libfmt-dev:arm64,
# libgtest-dev:arm64). Used by scripts/test_aarch64.sh.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Highway's NEON target needs the AES instructions (the crypto extension) in the baseline; SVE and
# SVE2 are compiled per function and chosen at run time.
set(CMAKE_CXX_FLAGS_INIT "-march=armv8-a+crypto")
# Headers and libraries of the arm64 packages; the host's architecture-independent ones (Eigen's
# headers, the CMake package files under /usr/share) stay visible.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
# Tests run under qemu-user; CMake only needs to know how to launch them.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
