#!/bin/sh
# Downloads Horovod's test/parallel/test_torch.py and test_adasum_pytorch.py and
# test/single/test_torch_elastic.py (Apache-2.0), pinned to one commit, to tests/horovod/parallel/
# and tests/horovod/single/, where tests/horovod/CMakeLists.txt registers them with CTest as
# acceptance tests of trainrun.torch.
# Re-run cmake afterwards.
set -eu
commit=2626dc87a3a8eb8fb7d2216198ce45bce0f9e65a
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$here/tests/horovod/parallel"
curl -fsSL "https://raw.githubusercontent.com/horovod/horovod/$commit/test/parallel/test_torch.py" \
  -o "$here/tests/horovod/parallel/test_torch.py"
echo "fetched Horovod's test_torch.py at $commit into tests/horovod/parallel/"
curl -fsSL \
  "https://raw.githubusercontent.com/horovod/horovod/$commit/test/parallel/test_adasum_pytorch.py" \
  -o "$here/tests/horovod/parallel/test_adasum_pytorch.py"
echo "fetched Horovod's test_adasum_pytorch.py at $commit into tests/horovod/parallel/"
mkdir -p "$here/tests/horovod/single"
curl -fsSL \
  "https://raw.githubusercontent.com/horovod/horovod/$commit/test/single/test_torch_elastic.py" \
  -o "$here/tests/horovod/single/test_torch_elastic.py"
echo "fetched Horovod's test_torch_elastic.py at $commit into tests/horovod/single/"
