#!/usr/bin/env bash
# The installed package stands on its own: install the build into a temporary prefix, build
# examples/ as an outside project against that prefix alone, run its example on 2 ranks.
#   install_test.sh BUILD SOURCE MPIEXEC
# Fails when the install or the outside build fails, when find_package finds ringattn anywhere but
# the prefix, when the outside build sees the source tree's headers, when the exported targets carry
# build-only flags (-march=native, sanitizers, warnings), or when the example's checks fail.
set -euo pipefail
build="$1" src="$2" mpiexec="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
for f in include/ringattn/ringattn.hpp lib/cmake/ringattn/ringattnConfig.cmake \
         lib/cmake/ringattn/ringattnConfigVersion.cmake lib/cmake/ringattn/ringattnTargets.cmake; do
  [ -f "$prefix/$f" ] || { echo "install_test: $f is not installed" >&2; exit 1; }
done
if grep -nE -- '-march=native|-fsanitize|-Wall|-Wextra|ringattn_tuning|ringattn_warnings' \
     "$prefix"/lib/cmake/ringattn/ringattnTargets*.cmake; then
  echo "install_test: build-only flags leak into the exported targets (above)" >&2
  exit 1
fi

cmake -S "$src/examples" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$tmp/configure.log" || {
  cat "$tmp/configure.log" >&2; exit 1; }
found="$(sed -n 's/^ringattn_DIR:PATH=//p' "$tmp/build/CMakeCache.txt")"
case "$found" in
  "$prefix"/*) ;;
  *) echo "install_test: find_package found ringattn in '$found', not in $prefix" >&2; exit 1 ;;
esac
if grep -q -- "-I$src/include\|-isystem $src/include" "$tmp/build/compile_commands.json"; then
  echo "install_test: the outside build compiles against the source tree's headers" >&2
  exit 1
fi
cmake --build "$tmp/build" -j 2 >"$tmp/build.log" || { cat "$tmp/build.log" >&2; exit 1; }
"$mpiexec" --oversubscribe -np 2 "$tmp/build/attention_example"
