#!/usr/bin/env bash
# The demo on real servers: import the digits model, start two workers and a watcher, personalize the
# model for three users from their own handwritten digits, and show each user's held-out accuracy
# before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
source deploy/fleet-session.sh demo
data=examples/data/digits.csv.gz
"$attune" model import Tests/Fixtures/digits-mlp-updatable.mlmodel --name digits

users=(alice bob carol)
jobs_per_user=3
# Each user writes 400 consecutive rows of the digits set: 300 to train on, 100 held out.
train_rows() { local i=$1; echo "$((i * 400)):$((i * 400 + 300))"; }
test_rows() { local i=$1; echo "$((i * 400 + 300)):$((i * 400 + 400))"; }

echo "== held-out accuracy before personalization"
for i in "${!users[@]}"; do
  "$attune" model evaluate --name digits --user "${users[$i]}" --csv "$data" --rows "$(test_rows "$i")"
done

echo "== two workers and a watcher"
"$attune" watch --model digits --exit-after $(( ${#users[@]} * jobs_per_user )) --idle-timeout 120 &
watcher=$!
"$attune" worker --name worker-1 >"$work/worker-1.log" 2>&1 & pids+=($!)
"$attune" worker --name worker-2 >"$work/worker-2.log" 2>&1 & pids+=($!)
sleep 1

echo "== enqueueing $jobs_per_user jobs of 100 samples for each of ${users[*]}"
start=$(date +%s.%N)
for i in "${!users[@]}"; do
  "$attune" enqueue --model digits --user "${users[$i]}" --csv "$data" --rows "$(train_rows "$i")" \
    --chunk 100 --format json >/dev/null
done
wait "$watcher"
elapsed=$(echo "$(date +%s.%N) - $start" | bc -l 2>/dev/null || python3 -c "print($(date +%s.%N) - $start)")
jobs=$(( ${#users[@]} * jobs_per_user ))
printf '== %d jobs in %.2f s: %.2f jobs/s\n' "$jobs" "$elapsed" "$(python3 -c "print($jobs / $elapsed)")"

echo "== held-out accuracy after personalization"
for i in "${!users[@]}"; do
  "$attune" model evaluate --name digits --user "${users[$i]}" --csv "$data" --rows "$(test_rows "$i")"
done
echo "== alice's versions"
"$attune" model history --name digits --user alice
"$attune" model export --name digits --user alice -o "$work/alice.mlmodel"
echo "== stopping workers (SIGTERM)"
