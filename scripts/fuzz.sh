#!/usr/bin/env bash
# Fuzzes the job decoder and validator (the package in Fuzz/) with libFuzzer for SECONDS (default 60).
# Usage: scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]
# New interesting inputs go to a throwaway corpus; a crashing input is kept in Fuzz/findings/ and the
# script exits non-zero. Rerun one with: Fuzz/.build/release/FuzzJobDecoder Fuzz/findings/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
shift || true
start=$(date +%s)
# SwiftPM's own --sanitize=fuzzer links libFuzzer's main instead of the module's entry point.
(cd Fuzz && swift build -c release --sanitize=fuzzer 2>&1 | grep -E "error|warning: unre|Build" | tail -n 5)
echo "fuzz build took $(( $(date +%s) - start )) s" >&2
work=$(mktemp -d /tmp/attune-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p Fuzz/findings
Fuzz/.build/release/FuzzJobDecoder "$work" Fuzz/corpus -dict=Fuzz/job.dict -max_total_time="$seconds" \
    -max_len=65536 -timeout=10 -rss_limit_mb=4096 -artifact_prefix=Fuzz/findings/ -print_final_stats=1 "$@"
