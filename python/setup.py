"""Builds and installs the trainrun package, and the trainrun launcher, for the interpreter that
runs this script.

    python3 -m pip install --no-build-isolation ./python    # from the repository root
    python3 python/setup.py bdist_wheel                     # or a wheel, for another machine

The extension (trainrun._core) and the launcher (installed as <prefix>/bin/trainrun, e.g. a venv's
bin/) are compiled by the project's CMake build (targets trainrun_python and trainrun), configured
for sys.executable, so the Debian libraries the rest of trainrun uses are needed (scripts/setup.sh
installs them); nothing is downloaded. Nothing is written into the source tree: the CMake build
and setuptools' own build and metadata folders live in $TRAINRUN_CMAKE_BUILD_DIR when set, else
in <tmp>/trainrun-pip-<python ABI>-<hash of this source tree>/, kept so that the next install of
the same tree is incremental.
"""

import hashlib
import os
import re
import subprocess
import sys
import sysconfig
import tempfile

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _work_dir():
    explicit = os.environ.get("TRAINRUN_CMAKE_BUILD_DIR")
    if explicit:
        return os.path.abspath(explicit)
    tag = sysconfig.get_config_var("SOABI") or "py"
    key = hashlib.sha256((ROOT + "\0" + sys.executable).encode()).hexdigest()[:12]
    return os.path.join(tempfile.gettempdir(), f"trainrun-pip-{tag}-{key}")


WORK = _work_dir()
CMAKE_BUILD = os.path.join(WORK, "cmake")


def _version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        match = re.search(r"project\(trainrun VERSION ([0-9.]+)", f.read())
    if not match:
        sys.exit(f"setup.py: no `project(trainrun VERSION ...)` in {ROOT}/CMakeLists.txt")
    return match.group(1)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
            sys.exit(f"setup.py: {ROOT} is not the trainrun source tree; run pip from a clone")
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 2)
        subprocess.check_call(["cmake", "-S", ROOT, "-B", CMAKE_BUILD, "-G", "Ninja",
                               "-DCMAKE_BUILD_TYPE=Release", "-DTRAINRUN_BUILD_TESTS=OFF",
                               "-DTRAINRUN_BUILD_BENCH=OFF",
                               f"-DTRAINRUN_PYTHON_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", CMAKE_BUILD, "-j", jobs, "--target",
                               "trainrun_python", "trainrun", "trainrun_rank_shim"])
        built = os.path.join(CMAKE_BUILD, "python", "trainrun")
        target = os.path.dirname(self.get_ext_fullpath(ext.name))
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(built):
            if name.startswith("_core") and name.endswith(".so"):
                self.copy_file(os.path.join(built, name), os.path.join(target, name))


os.makedirs(WORK, exist_ok=True)
os.chdir(HERE)  # setuptools finds packages relative to the working directory
setup(
    name="trainrun",
    version=_version(),
    description="Collectives and a Horovod-style PyTorch API for jobs started by trainrun",
    packages=find_packages(include=["trainrun", "trainrun.*"]),
    ext_modules=[CMakeExtension("trainrun._core")],
    cmdclass={"build_ext": CMakeBuild},
    # The launcher, as <prefix>/bin/trainrun (python3 -m trainrun runs it), and the rank shim it
    # finds as <prefix>/libexec/trainrun/trainrun-rank-shim.
    data_files=[("bin", [os.path.join(CMAKE_BUILD, "bin", "trainrun")]),
                ("libexec/trainrun", [os.path.join(CMAKE_BUILD, "bin", "trainrun-rank-shim")])],
    # Builds and metadata outside the source tree.
    options={"build": {"build_base": os.path.join(WORK, "setuptools")},
             "egg_info": {"egg_base": WORK}},
    python_requires=">=3.8",
    zip_safe=False,
)
