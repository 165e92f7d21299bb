#!/usr/bin/env bash
# vendor.sh RDMA_CORE_GIT_DIR — (re)extract the vendored rdma-core test files into ./rdma-core
# from a clone of rdma-core (github.com/linux-rdma/rdma-core) at the pinned release, and say
# whether they differ from what is committed. CI cannot reach GitHub, hence the copy.
set -euo pipefail
TAG=v44.0 # Debian 12's rdma-core (44.0-2), whose python3-pyverbs runs them
FILES=(
	COPYING.md COPYING.BSD_MIT
	tests/__init__.py tests/args_parser.py tests/run_tests.py
	tests/base.py tests/utils.py tests/efa_base.py tests/mlx5_base.py
	tests/test_qpex.py tests/test_mr.py tests/test_qp.py tests/test_cq.py
	tests/test_device.py tests/test_pd.py tests/test_atomic.py tests/test_cqex.py
	tests/test_cq_events.py
)
[[ $# -eq 1 ]] || { echo "usage: $0 RDMA_CORE_GIT_DIR" >&2; exit 2; }
cd "$(dirname "${BASH_SOURCE[0]}")"
rm -rf rdma-core && mkdir rdma-core
git --git-dir="$1" archive "$TAG" "${FILES[@]}" | tar -x -C rdma-core
git status --short -- rdma-core
