"""Builds the package `ringattn` for `pip install --no-build-isolation .`.

The extension ringattn._ringattn is the CMake build's target ringattn_python: this configures the
project in setuptools' build directory (tests, benchmarks and install rules off; the Python that
runs pip as the one to build for), builds that target alone, and copies the module it made into
the package; the pure-Python files come from python/ringattn. CMake arguments may be added with
the environment variable CMAKE_ARGS (e.g. "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"); the build runs
CMAKE_BUILD_PARALLEL_LEVEL jobs (default: every CPU).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        return re.search(r"project\(ringattn VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    """ringattn._ringattn from the CMake build (one extension, built by CMake, not by setuptools)."""

    def build_extension(self, ext):
        build = os.path.abspath(os.path.join(self.build_temp, "cmake"))
        configure = ["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython3_EXECUTABLE={sys.executable}", "-DRINGATTN_PYTHON=ON", "-DRINGATTN_TESTS=OFF",
                     "-DRINGATTN_BENCHMARKS=OFF", "-DRINGATTN_INSTALL=OFF",
                     *shlex.split(os.environ.get("CMAKE_ARGS", ""))]
        env = dict(os.environ)
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        if shutil.which("cmake") is None:
            sys.exit("ringattn: cmake not found (Debian: apt-get install cmake; scripts/setup.sh installs "
                     "everything the build needs)")
        done = subprocess.run(configure, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        print(done.stdout)
        if done.returncode != 0:
            sys.exit(f"ringattn: CMake could not configure the build (above); command: {shlex.join(configure)}")
        skipped = [line for line in done.stdout.splitlines() if "Python package skipped" in line]
        if skipped:  # python/CMakeLists.txt says what is missing
            sys.exit(skipped[0].strip("- ").strip())
        subprocess.run(["cmake", "--build", build, "--target", "ringattn_python"], cwd=ROOT, env=env, check=True)
        made = os.path.join(build, "python", "ringattn", os.path.basename(self.get_ext_filename(ext.name)))
        if not os.path.isfile(made):
            sys.exit(f"ringattn: the CMake build made no {made}")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(made, target)


setup(
    version=version(),
    packages=["ringattn"],
    package_dir={"ringattn": "python/ringattn"},
    ext_modules=[Extension("ringattn._ringattn", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
