#!/usr/bin/env bash
# `pip install` from a clone works in a fresh virtual environment, offline, and the installed package
# runs the Python example under mpirun.
#   pip_install_test.sh SOURCE PYTHON MPIEXEC
# The clone is the source tree's files git knows (tracked or not ignored, as they are now), copied
# to a temporary directory; the venv is `PYTHON -m venv --system-site-packages` (torch, numpy and
# mpi4py from the system); `pip install --no-build-isolation --no-index` must build and install it
# without the network (with --no-deps only where a system package's own metadata asks for what the
# system lacks, as Debian 13's torch does). Then, from outside the clone and without PYTHONPATH,
# `import ringattn` must come from the venv, and tests/python/train_step_test.py run with the venv's
# Python must pass: `mpirun -np 2 VENV/bin/python examples/train_step.py` against the same model on
# one process.
# With ccache on PATH the build goes through it (CMAKE_ARGS), so a second run is quick.
set -euo pipefail
src="$1" python="$2" mpiexec="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
unset PYTHONPATH

mkdir "$tmp/clone"
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  git -C "$src" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -f "$src/$f" ] && printf '%s\0' "$f"; done |
    tar -C "$src" --null -T - -cf - | tar -C "$tmp/clone" -xf -
else
  tar -C "$src" --exclude='./build' --exclude='./build-*' -cf - . | tar -C "$tmp/clone" -xf -
fi

"$python" -m venv --system-site-packages "$tmp/venv"
if command -v ccache >/dev/null; then
  export CMAKE_ARGS="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache"
  export CCACHE_BASEDIR="$tmp"  # paths under the clone hash alike whatever the temporary directory
fi
install() { "$tmp/venv/bin/pip" install -v --no-build-isolation --no-index "$@" "$tmp/clone" >"$tmp/pip.log" 2>&1; }
if ! install; then
  # A system dependency whose own metadata asks for what the system lacks (Debian 13's torch asks for
  # sympy==1.13.1 and Debian ships 1.13.3) is not ours to fix: said, and installed without the check.
  # Any other failure, ours included, fails the test.
  if grep -qE "^ERROR: Could not find a version that satisfies the requirement .*\(from (torch|mpi4py|numpy)\)" \
       "$tmp/pip.log"; then
    grep -E "^ERROR: Could not find a version" "$tmp/pip.log" >&2
    echo "pip_install_test: a system package asks for a version this system lacks (above): again with --no-deps" >&2
    install --no-deps || { tail -n 60 "$tmp/pip.log" >&2; echo "pip_install_test: pip install --no-deps failed" >&2; exit 1; }
  else
    tail -n 60 "$tmp/pip.log" >&2
    echo "pip_install_test: pip install --no-build-isolation --no-index failed (log above)" >&2
    exit 1
  fi
fi
grep -E "^Successfully installed" "$tmp/pip.log"

cd "$tmp"
where="$("$tmp/venv/bin/python" -c 'import ringattn, ringattn.nn; print(ringattn.__file__)')"
case "$where" in
  "$tmp/venv/"*) echo "ringattn imported from $where" ;;
  *) echo "pip_install_test: ringattn imported from '$where', not from the venv $tmp/venv" >&2; exit 1 ;;
esac
"$tmp/venv/bin/python" "$tmp/clone/tests/python/train_step_test.py" --mpirun "$mpiexec" \
  --script "$tmp/clone/examples/train_step.py"
