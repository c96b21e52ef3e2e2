"""Builds and installs the trainrun package for the interpreter that runs this script.

    python -m pip install --no-build-isolation ./python     # from the repository root
    python python/setup.py bdist_wheel                      # or a wheel, for another machine

The extension is compiled by the project's CMake build (targets trainrun_python and its
dependencies, in build-<python tag>/ beside the sources), configured for sys.executable, so the
same Debian libraries the rest of trainrun uses are needed (scripts/setup.sh installs them).
"""

import os
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not os.path.exists(os.path.join(ROOT, "CMakeLists.txt")):
            sys.exit(f"setup.py: {ROOT} is not the trainrun source tree; run pip from a clone")
        tag = sysconfig.get_config_var("SOABI") or "py"
        build_dir = os.path.join(ROOT, f"build-{tag}")
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
                               "-DCMAKE_BUILD_TYPE=Release", "-DTRAINRUN_BUILD_TESTS=OFF",
                               "-DTRAINRUN_BUILD_BENCH=OFF",
                               f"-DTRAINRUN_PYTHON_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build_dir, "-j2", "--target",
                               "trainrun_python"])
        built = os.path.join(build_dir, "python", "trainrun")
        target = os.path.dirname(self.get_ext_fullpath(ext.name))
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(built):
            if name.startswith("_core") and name.endswith(".so"):
                self.copy_file(os.path.join(built, name), os.path.join(target, name))


os.chdir(HERE)  # setuptools finds packages relative to the working directory
setup(
    name="trainrun",
    version="0.1.0",
    description="Collectives and a Horovod-style PyTorch API for jobs started by trainrun",
    packages=["trainrun", "trainrun.torch"],
    ext_modules=[CMakeExtension("trainrun._core")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.8",
    zip_safe=False,
)
