#!/usr/bin/env bash
# Throughput of the fleet on real servers: queue JOBS jobs of SAMPLES digits each for USERS users, then
# start WORKERS worker processes (CONCURRENCY slots each) and time how long they take to drain the queue.
#   deploy/bench.sh [WORKERS] [CONCURRENCY] [JOBS] [SAMPLES] [USERS]
set -euo pipefail
cd "$(dirname "$0")/.."
workers=${1:-2} concurrency=${2:-1} jobs=${3:-200} samples=${4:-50} users=${5:-20}
source deploy/fleet-session.sh bench
"$attune" model import Tests/Fixtures/digits-mlp-updatable.mlmodel --name digits >/dev/null

per_user=$(( (jobs + users - 1) / users ))
queued=0
for ((u = 0; u < users && queued < jobs; u++)); do
  n=$(( per_user < jobs - queued ? per_user : jobs - queued ))
  start_row=$(( (u * per_user * samples) % (1797 - n * samples) ))
  "$attune" enqueue --model digits --user "user$u" --csv examples/data/digits.csv.gz \
    --rows "$start_row:$(( start_row + n * samples ))" --chunk "$samples" >/dev/null
  queued=$(( queued + n ))
done
echo "queued $queued jobs of $samples samples (10 epochs each) for $users users"

"$attune" watch --exit-after "$queued" --idle-timeout 300 >/dev/null 2>&1 &
watcher=$!
sleep 0.5
start=$(date +%s.%N)
for ((w = 1; w <= workers; w++)); do
  "$attune" worker --no-migrate --concurrency "$concurrency" --name "bench-$w" >"$work/worker-$w.log" 2>&1 &
  pids+=($!)
done
wait "$watcher"
python3 -c "
import sys; elapsed = $(date +%s.%N) - $start
print(f'{$workers} workers x {$concurrency} slots: {$queued} jobs in {elapsed:.2f} s = {$queued / elapsed:.1f} jobs/s, '
      f'{$queued * $samples * 10 / elapsed:.0f} samples x epochs / s')"
