"""`python3 -m trainrun ...` runs the trainrun launcher installed with this package.

    python3 -m trainrun -np 4 python3 train.py      # the same as: trainrun -np 4 python3 train.py

The launcher is the one beside the package: <prefix>/bin/trainrun for a package under
<prefix>/lib/python3*/ (cmake --install, the .deb, pip install into a venv), or build/bin/trainrun
for the build tree's build/python/trainrun. Never one found on PATH, which may be another version.
"""

import os
import sys


def _candidates():
    package = os.path.dirname(os.path.abspath(__file__))
    parts = package.split(os.sep)
    # <prefix>/lib/python3.X/site-packages/trainrun, <prefix>/lib/python3/dist-packages/trainrun,
    # /usr/local/lib/python3.X/dist-packages/trainrun: the prefix is what precedes lib/python3*.
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] in ("lib", "lib64") and parts[i + 1].startswith("python3"):
            yield os.path.join(os.sep.join(parts[:i]) or os.sep, "bin", "trainrun")
            break
    # The build tree: build/python/trainrun beside build/bin/trainrun.
    yield os.path.join(os.path.dirname(os.path.dirname(package)), "bin", "trainrun")


def main():
    tried = []
    for launcher in _candidates():
        if os.access(launcher, os.X_OK) and os.path.isfile(launcher):
            os.execv(launcher, [launcher] + sys.argv[1:])
        tried.append(launcher)
    sys.stderr.write(
        "python3 -m trainrun: no trainrun launcher was installed with this package (looked for "
        + " and ".join(tried) + "); install trainrun with its Debian package, `cmake --install`, "
        "or `pip install` of trainrun's python/ folder, or run the trainrun you built "
        "(build/bin/trainrun)\n")
    sys.exit(127)


if __name__ == "__main__":
    main()
