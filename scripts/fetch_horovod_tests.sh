#!/bin/sh
# Horovod's test/parallel/test_torch.py and test_adasum_pytorch.py and
# test/single/test_torch_elastic.py (Apache-2.0) are kept in tests/horovod/parallel/ and
# tests/horovod/single/, unmodified, pinned to one commit (tests/horovod/NOTICE), where
# tests/horovod/CMakeLists.txt registers them with CTest as acceptance tests of trainrun.torch.
#
#   scripts/fetch_horovod_tests.sh            checks the kept copies against their SHA-256 sums
#   scripts/fetch_horovod_tests.sh --refresh  downloads them again at the commit, then checks them
#
# A file that differs from Horovod's at the commit fails the check, naming it.
set -eu
commit=2626dc87a3a8eb8fb7d2216198ce45bce0f9e65a
here=$(cd "$(dirname "$0")/.." && pwd)
files="parallel/test_torch.py 8af114f63fb7a87271322ad2da2c7050c3a9028570e45e8c44e9b1b4cac8db3a
parallel/test_adasum_pytorch.py 64e460606018e86ba088390b2eb12a678f2b1bbba107538b030bfe700516f98d
single/test_torch_elastic.py d57232328772dfca9a721137bfa90e15931d9fe9d2f1380d69a54a7f6345ca92"
case "${1:-}" in
  "") refresh=0 ;;
  --refresh) refresh=1 ;;
  *) echo "fetch_horovod_tests.sh: unknown argument '$1' (takes --refresh or nothing)" >&2; exit 2 ;;
esac
status=0
echo "$files" | while read -r path sum; do
  dest="$here/tests/horovod/$path"
  if [ "$refresh" = 1 ]; then
    mkdir -p "$(dirname "$dest")"
    curl -fsSL "https://raw.githubusercontent.com/horovod/horovod/$commit/test/$path" -o "$dest"
    echo "fetched Horovod's test/$path at $commit into tests/horovod/$path"
  fi
  if [ ! -f "$dest" ]; then
    echo "fetch_horovod_tests.sh: tests/horovod/$path is missing (--refresh downloads it)" >&2
    exit 1
  fi
  got=$(sha256sum "$dest" | cut -d' ' -f1)
  if [ "$got" != "$sum" ]; then
    echo "fetch_horovod_tests.sh: tests/horovod/$path is not Horovod's test/$path at $commit" \
         "(SHA-256 $got, expected $sum); it must stay unmodified" >&2
    exit 1
  fi
done || status=1
[ "$status" = 0 ] && echo "Horovod's three test files are Horovod's own at $commit"
exit "$status"
