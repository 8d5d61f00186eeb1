#!/usr/bin/env bash
# Training speed per model kind, in a release build: samples per second of update tasks on the
# coremltools-built fixtures and an MNIST-shaped conv net, and k-NN predictions per second.
# Prints figures only. The first release build of the tests takes several minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install-deps.sh --python
python=${ATTUNE_VENV:-$PWD/.venv}/bin/python
fixtures=$(mktemp -d /tmp/attune-bench-training.XXXXXX)
trap 'rm -rf "$fixtures"' EXIT
"$python" Tests/python/coreml_fixtures.py "$fixtures" >/dev/null 2>&1
ATTUNE_BENCHMARK=1 ATTUNE_TEST_FIXTURES=$fixtures ATTUNE_PYTHON=$python \
  swift test -c release -Xswiftc -enable-testing --disable-swift-testing --filter ThroughputBenchmarks 2>&1 |
  grep -E "samples/s|predictions/s|error|failed"
