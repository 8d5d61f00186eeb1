#!/usr/bin/env bash
# The test command: installs what is missing, starts throwaway servers, builds, and runs every test
# against them (integration tests fail rather than skip when a server is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --python --browser
export ATTUNE_PYTHON=${ATTUNE_VENV:-$PWD/.venv}/bin/python
work=$(mktemp -d /tmp/attune-test.XXXXXX)
chmod 755 "$work"
trap 'scripts/services.sh stop "$work" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
# Both servers also listen with TLS (a throwaway CA; the TLS suite runs a worker, enqueue and watch there).
services=$(ATTUNE_TLS=1 scripts/services.sh start "$work")
eval "$services"
export ATTUNE_REQUIRE_SERVICES=1 ATTUNE_REQUIRE_TLS=1 ATTUNE_REQUIRE_BROWSER=1
# The integration test targets are part of the package only with this set (see Package.swift): a plain
# `swift test` runs the unit tests alone.
export ATTUNE_INTEGRATION_TESTS=1
# The dashboard test's screenshot (and any other artefact) stays here after the run.
export ATTUNE_TEST_ARTIFACTS=${ATTUNE_TEST_ARTIFACTS:-$PWD/.artifacts}
export ATTUNE_TEST_FIXTURES="$work/fixtures"
"$ATTUNE_PYTHON" Tests/python/coreml_fixtures.py "$ATTUNE_TEST_FIXTURES" 2>&1 | grep -v "Failed to load" >&2
# The Kubernetes manifests against Kubernetes' schemas, and docker-compose.yml.
scripts/check-manifests.sh
# Every shell block of the operator's pages that drives containers is run by the deployment drill or says why not.
python3 scripts/doc-blocks.py check docs/operations.md docs/upgrades.md docs/backup.md
start=$(date +%s)
# Where the run's time goes, phase by phase (CI has a budget; see CONTRIBUTING.md).
phase_start=$start
took() { echo "[test.sh] $1: $(( $(date +%s) - phase_start )) s (total $(( $(date +%s) - start )) s)" >&2; phase_start=$(date +%s); }
# Where the build goes. A fresh clone (CI's) builds in a cache folder outside it, kept between runs as CI
# systems keep a build cache: the dependencies (BoringSSL twice, NIO, Hummingbird) are compiled once, not
# each run, since their sources sit in the cache at the same path every time. A checkout that has its own
# .build keeps using it. .build/debug then points into the cache, where the scripts below look for the binary.
scratch=.build
if [ -n "${ATTUNE_SCRATCH_PATH:-}" ]; then
  scratch=$ATTUNE_SCRATCH_PATH
elif [ ! -e .build ] || { [ -L .build/debug ] && [ ! -e .build/build.db ]; }; then
  scratch=${XDG_CACHE_HOME:-$HOME/.cache}/attune/swiftpm-debug
fi
if [ "$scratch" != .build ]; then
  mkdir -p "$scratch" .build
  ln -sfn "$(realpath -m "$scratch")/x86_64-unknown-linux-gnu/debug" .build/debug
  echo "building in $scratch (a build cache kept between runs; ATTUNE_SCRATCH_PATH chooses another)"
fi
export ATTUNE_SCRATCH_PATH=$scratch
# The build's output goes to a file: on success its last lines are enough, on failure its errors are printed.
# A cached build that fails is tried once more from nothing, in case the cache itself is what broke.
build() { swift build --build-tests --scratch-path "$scratch" >"$work/build.log" 2>&1; }
if ! build && { [ "$scratch" = .build ] || ! { echo "the cached build failed; building again from nothing" >&2; rm -rf "$scratch"; build; }; }; then
  grep -a -E -A4 "error:|Stack dump|Killed|LLVM ERROR" "$work/build.log" | head -n 80 >&2
  tail -n 20 "$work/build.log" >&2
  echo "the build failed (output above)" >&2
  exit 1
fi
tail -n 3 "$work/build.log"
took "the build"
# Every flag of every command and every environment variable the sources read has its row in
# docs/configuration.md (and no row names one that is gone).
"$ATTUNE_PYTHON" scripts/check-reference-docs.py .build/debug/attune
# Every test stores base models and states encrypted (a throwaway key; the store's own tests also cover
# clear text), and the fault suite below inherits it. See docs/encryption.md.
ATTUNE_KEYS="ci:$(head -c 32 /dev/urandom | base64)"
export ATTUNE_KEYS
# XCTest only: a Swift Testing summary of "0 tests" would close the output and misreport the run.
# The throughput benchmarks print figures only; Benchmarks/training.sh runs them in a release build.
# The output is also kept: CI shows only the run's last lines, so a failure's assertions are printed again at the end.
if ! swift test --skip-build --scratch-path "$scratch" --disable-swift-testing --skip ThroughputBenchmarks "$@" 2>&1 | tee "$work/xctest.log"; then
  echo "[test.sh] the XCTest suites failed; the failing assertions and tests:" >&2
  grep -a -E ": error: |' failed \(" "$work/xctest.log" | head -n 60 >&2
  mkdir -p "$ATTUNE_TEST_ARTIFACTS" && cp "$work/xctest.log" "$ATTUNE_TEST_ARTIFACTS/xctest.log"
  mkdir -p "$HOME/.cache/attune" && cp "$work/xctest.log" "$HOME/.cache/attune/last-failed-xctest.log"
  exit 1
fi
took "the XCTest suites"
# The float64 NumPy reference tests again under each other kernel set this processor runs (ATTUNE_TRAINING_KERNELS;
# the run above had the set chosen for it): every set a user's server may get trains the same math. About 30 s.
if [ $# -eq 0 ]; then
  flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
  sets=(portable)
  [[ "$flags" == *" avx2 "* && "$flags" == *" fma "* ]] && sets+=(avx2)
  for each in "${sets[@]}"; do
    if ! ATTUNE_TRAINING_KERNELS=$each swift test --skip-build --scratch-path "$scratch" --disable-swift-testing --filter \
        'AttuneTrainingIntegrationTests\.(ReferenceTests|LossOptimizerReferenceTests|LearningRateScheduleReferenceTests)|TrainingKernelsTests' \
        >"$work/kernels-$each.log" 2>&1; then
      grep -a -E "error|failed" "$work/kernels-$each.log" | head -n 40 >&2
      echo "the reference tests failed with ATTUNE_TRAINING_KERNELS=$each" >&2
      exit 1
    fi
    echo "kernel set $each: $(grep -E "Executed [0-9]+ tests" "$work/kernels-$each.log" | tail -n 1 | sed 's/^[[:space:]]*//')"
  done
  took "the reference tests under each kernel set"
fi
# The privacy accountant (`attune privacy epsilon`) against Google's dp-accounting on a grid of sample rates, noise
# multipliers, rounds and δ: ε and the divergence at each of the 156 orders, to a relative 1e-6. About 90 s on the
# 2-core machine, most of it 240 starts of the debug binary.
if [ $# -eq 0 ]; then
  "$ATTUNE_PYTHON" Tests/python/dp_accounting_check.py .build/debug/attune
  took "the privacy accountant against dp-accounting"
fi
# The producers' side, on servers of their own (each starts a worker that takes every partition): the
# least-privilege producer user against the broker's permissions, the Go example (Debian's amqp091-go, no module
# download) and the Python client (mypy --strict, then pytest against a real worker and serve). Then the devices'
# side: the Swift client for apps (clients/swift, its own package, against a real serve) and the race of four
# devices of one user and the fleet's jobs on that user's line (scripts/device-race.sh). About three minutes.
if [ $# -eq 0 ]; then
  (
    eval "$(scripts/services.sh start "$work/producers" 2>"$work/producers-services.log")"
    trap 'scripts/services.sh stop "$work/producers" >/dev/null 2>&1 || true' EXIT
    export ATTUNE_RABBITMQ_DIR=$work/producers
    "$ATTUNE_PYTHON" scripts/producer-user-test.py
    examples/go/run-test.sh
    clients/python/run-tests.sh -q
    took "the producers' side"
    if ! ATTUNE_SWIFT_CLIENT_SCRATCH=$work/swift-client clients/swift/run-tests.sh >"$work/swift-client.log" 2>&1; then
      grep -a -E "error|failed|Fail" "$work/swift-client.log" | head -n 40 >&2
      tail -n 20 "$work/swift-client.log" >&2
      echo "the Swift client's tests failed" >&2
      exit 1
    fi
    grep -E "Executed [0-9]+ tests" "$work/swift-client.log" | tail -n 1
    took "the Swift client"
    if ! scripts/device-race.sh >"$work/device-race.log" 2>&1; then
      tail -n 40 "$work/device-race.log" >&2
      echo "the device race failed" >&2
      exit 1
    fi
    tail -n 12 "$work/device-race.log"
    took "the device race"
  )
  phase_start=$(date +%s)
fi
# The operator's drills, each on servers of its own: backup and restore (a dump restored into a new server
# byte-identical, nothing opening without the keys, a forgotten user staying forgotten, pgBackRest's
# point-in-time restore; about 35 s), and an upgrade from the previous release under a running fleet (about
# 20 s once the previous release is built and cached; its first build takes about 3 minutes).
if [ $# -eq 0 ]; then
  scripts/backup-drill.sh
  took "the backup drill"
  scripts/upgrade-drill.sh
  took "the upgrade drill"
  # Deployed as users deploy it: deploy/Dockerfile built with podman, docker-compose.yml brought up with real
  # PostgreSQL and RabbitMQ containers, and the docs' Compose blocks run as written (docs/operations.md, "The
  # deployment drill"). About 5 minutes with the images cached; a source change rebuilds the image (about 8).
  scripts/deploy-drill.sh
  took "the deployment drill"
fi
# The fault suite, bounded (about a minute and a half): workers SIGKILLed and SIGTERMed; the workers' PostgreSQL
# backends terminated 8 times (most while a commit runs); PostgreSQL restarted, crashed (immediate stop) and its
# postmaster SIGKILLed, once each; RabbitMQ restarted once; then every job checked, and every job reported
# completed found in the database. Then once more on a RabbitMQ cluster. Skipped when arguments narrow the run
# to some tests.
if [ $# -eq 0 ]; then
  scripts/fault-suite.sh --debug --jobs 300 --users 20 --hot 2 --workers 3 --kills 3 --sigterms 2 --bad 5 \
    --republish 10 --samples 40 --pg-terminates 8 --timeout 240
  took "the fault suite"
  # The same against a three-node RabbitMQ cluster, bounded: workers spread over the nodes, the node leading
  # the partition queues stopped mid-run and started again, then SIGKILLed and started again; PostgreSQL
  # restarted once and its backends terminated 4 times (its crashes are the run above's; the full run:
  # scripts/fault-suite.sh --cluster 3).
  scripts/fault-suite.sh --debug --cluster 3 --jobs 240 --users 16 --hot 2 --workers 3 --kills 2 --sigterms 1 \
    --bad 4 --republish 8 --samples 40 --pg-terminates 4 --pg-crashes 0 --pg-kills 0 --node-kills 1 --timeout 300
  took "the fault suite on a RabbitMQ cluster"
  # PostgreSQL as a primary and a synchronous standby under pg_auto_failover (scripts/postgres-ha.sh, its detection
  # shortened for loopback), every process on the multi-host URL: the primary SIGKILLed with its pg_autoctl while
  # jobs flow, the standby promoted by pg_auto_failover, the old primary rejoining as standby, then a planned
  # failover back; backends terminated 4 times. About a minute and a half.
  ATTUNE_HA_FAST=1 scripts/fault-suite.sh --debug --ha --jobs 300 --users 20 --hot 2 --workers 3 --kills 2 --sigterms 1 \
    --bad 4 --republish 8 --samples 40 --pg-terminates 4 --timeout 300
  took "the fault suite on the PostgreSQL HA pair"
  # A fleet past the old cap of 16: 48 worker processes of one slot on the 64 partitions, 320 users so that every
  # partition gets jobs, a RabbitMQ restart and 2 termination rounds; fails unless every worker commits.
  scripts/fault-suite.sh --debug --workers 48 --partitions 64 --every-worker-commits --jobs 1000 --users 320 --hot 0 \
    --kills 0 --sigterms 0 --bad 4 --republish 8 --samples 20 --pg-terminates 2 --pg-restarts 0 --pg-crashes 0 \
    --pg-kills 0 --timeout 300
  took "the fault suite with 48 workers"
  # A repartition from 16 to 64 partitions under load (`attune topology repartition`): half the jobs queued,
  # the other half published while it runs, workers SIGKILLed and SIGTERMed and RabbitMQ restarted meanwhile;
  # fails unless every job ended once, every user's model is a replay of its jobs in publish order, and the
  # fleet ends on the new generation alone. About a minute.
  scripts/fault-suite.sh --debug --partitions 16 --repartition 64 --workers 4 --jobs 600 --users 40 --hot 2 --kills 3 \
    --sigterms 1 --bad 6 --republish 10 --samples 40 --pg-terminates 4 --pg-restarts 0 --pg-crashes 0 --pg-kills 0 \
    --timeout 300
  took "the fault suite with a repartition"
fi
