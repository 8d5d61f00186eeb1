#!/usr/bin/env bash
# The demo on real servers: import a digits model trained on other writers, start two workers and a
# watcher, personalize it for three users from their own handwritten digits, and show each user's
# held-out accuracy before and after, and which of their digits the personal model now reads differently.
# Alice's job carries her 40 held-out digits as its validation set: each epoch reports how her
# model does on them while it trains.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/fleet-session.sh demo
data=examples/data/digits.csv.gz
# Models and states are stored encrypted (see docs/encryption.md): a throwaway key unless
# ATTUNE_KEYS or ATTUNE_KEYS_FILE is set. Every command below takes it from the environment.
if [ -z "${ATTUNE_KEYS:-}${ATTUNE_KEYS_FILE:-}" ]; then
  ATTUNE_KEYS=$("$attune" keys generate --id demo)
  export ATTUNE_KEYS
fi
# Built by Tests/python/coreml_fixtures.py: trained on rows 0-1199 (other writers), updatable.
"$attune" model import examples/models/digits-pretrained.mlmodel --name digits
# Each job is kept with the version it made (sealed like the models), so that a new base can be trained
# with every user's own samples again: the rebase below.
"$attune" model retention --name digits --samples 30d

users=(alice bob carol)
# One job of 60 samples per user: jobs of one user that two workers race are applied in commit order,
# and on a base this good the order of small jobs shows in the result; one job gives the same figures
# every run (the ones the tests check).
jobs_per_user=1
# Each user writes 100 consecutive rows of the digits set that the base never saw (from row 1200): 60 to
# train on, 40 held out.
train_rows() { local i=$1; echo "$((1200 + i * 100)):$((1200 + i * 100 + 60))"; }
test_rows() { local i=$1; echo "$((1200 + i * 100 + 60)):$((1200 + i * 100 + 100))"; }

echo "== held-out accuracy before personalization"
for i in "${!users[@]}"; do
  "$attune" model evaluate --name digits --user "${users[$i]}" --csv "$data" --rows "$(test_rows "$i")"
done

echo "== the broker's topology (64 job partitions), two workers and a watcher"
"$attune" topology declare >/dev/null
# The watcher's lines go to the screen and to a file, from which alice's epochs are picked out below.
"$attune" watch --model digits --exit-after $(( ${#users[@]} * jobs_per_user )) --idle-timeout 120 \
  > >(tee "$work/watch.log") &
watcher=$!
"$attune" worker --name worker-1 >"$work/worker-1.log" 2>&1 & pids+=($!)
"$attune" worker --name worker-2 >"$work/worker-2.log" 2>&1 & pids+=($!)
sleep 1

echo "== enqueueing a job of 60 samples for each of ${users[*]}"
start=$(date +%s.%N)
for i in "${!users[@]}"; do
  validation=()
  # Validation samples are never trained on, so they stay held out for the evaluation after.
  [ "${users[$i]}" = alice ] && validation=(--validation-csv "$data" --validation-rows "$(test_rows "$i")")
  "$attune" enqueue --model digits --user "${users[$i]}" --csv "$data" --rows "$(train_rows "$i")" \
    --chunk 60 --format json "${validation[@]}" >/dev/null
done
wait "$watcher"
elapsed=$(echo "$(date +%s.%N) - $start" | bc -l 2>/dev/null || python3 -c "print($(date +%s.%N) - $start)")
jobs=$(( ${#users[@]} * jobs_per_user ))
printf '== %d jobs in %.2f s: %.2f jobs/s\n' "$jobs" "$elapsed" "$(python3 -c "print($jobs / $elapsed)")"

echo "== alice's validation accuracy per epoch (her 40 held-out digits, from her job's events: its epochs, as attune watch prints them)"
for _ in $(seq 50); do grep -q "digits/alice .*completed" "$work/watch.log" && break; sleep 0.1; done
grep "digits/alice .* epoch " "$work/watch.log" | sed -E 's/.* epoch ([0-9]+)\/([0-9]+) loss ([0-9.]+), validation loss ([0-9.]+) accuracy ([0-9.]+)/  epoch \1\/\2: training loss \3, validation loss \4, validation accuracy \5/'
echo "== held-out accuracy after personalization"
for i in "${!users[@]}"; do
  "$attune" model evaluate --name digits --user "${users[$i]}" --csv "$data" --rows "$(test_rows "$i")"
done
echo "== alice's held-out digits that her personal model reads differently from the base"
"$attune" model predict --name digits --user alice --csv "$data" --rows "$(test_rows 0)" --compare | grep -E "changed|differ"
echo "== alice's versions"
"$attune" model history --name digits --user alice
"$attune" model export --name digits --user alice -o "$work/alice.mlmodel"
echo "== what PostgreSQL holds: every base model and state encrypted"
"$attune" keys status

echo "== a linked doodle classifier learns a label it never had: dana draws five stars"
# Built as coremltools' updatable_linked_model notebook builds its tiny drawing classifier: the drawing
# embedding (8x8 gray image -> 32 values, trained in NumPy by Tests/python/coreml_fixtures.py) is its own
# model, and the pipeline links to it by file name (DrawingEmbedding.mlmodelc) ahead of an empty k-NN.
"$attune" model import examples/models/DrawingEmbedding.mlmodel --name DrawingEmbedding
"$attune" model import examples/models/LinkedDrawingClassifier.mlmodel --name doodles
# The CSV rows (0-16 per pixel) go as 8x8 gray PNGs, the image input the embedding takes.
drawings=(--input-feature drawing --label-feature label --image-size 8x8 --pixel-scale 15.9375)
"$attune" enqueue --model doodles --user dana --csv "$data" --rows 1500:1560 "${drawings[@]}" --format json >/dev/null
"$attune" enqueue --model doodles --user dana --csv examples/data/stars.csv --rows 0:5 "${drawings[@]}" >/dev/null
for _ in $(seq 100); do
  [ "$("$attune" model history --name doodles --user dana | tail -n +2 | wc -l)" -ge 2 ] && break
  sleep 0.2
done
"$attune" model history --name doodles --user dana
echo "== two new star drawings, and two of dana's held-out digits"
"$attune" model predict --name doodles --user dana --csv examples/data/stars.csv --rows 5:7 --compare "${drawings[@]}"
"$attune" model predict --name doodles --user dana --csv "$data" --rows 1560:1562 --compare "${drawings[@]}" | tail -n +2
echo "== dana's doodle classifier as an app ships it: the pipeline with its link, and the linked model"
"$attune" model export --name doodles --user dana -o "$work/Doodles.mlmodel" --linked-models "$work/linked"
echo "== alice's phone fetches her personal model: the device port, her token, and nothing else"
# The application's backend holds a device key and signs a short-lived token for the user it logged in
# (here with attune token device; examples/python/device_token.py does the same with PyJWT).
"$attune" app key create --app demo_app --model digits > "$work/demo_app.jwk" 2>/dev/null
alice_token=$("$attune" token device --key-file "$work/demo_app.jwk" --user alice --ttl 10m)
printf 'a long demo operator password\n' | "$attune" operator add --file "$work/operators" ops
device_port=$(scripts/free-port); admin_port=$(scripts/free-port)
"$attune" serve --host 127.0.0.1 --port "$device_port" --admin-port "$admin_port" --operators "$work/operators" \
  >"$work/serve.log" 2>&1 & pids+=($!)
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$device_port/healthz" >/dev/null && break; sleep 0.1; done
device=http://127.0.0.1:$device_port
status() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
etag=$(curl -s -D - -o "$work/alice-phone.mlmodel" -H "Authorization: Bearer $alice_token" "$device/v1/models/digits/users/alice" |
  tr -d '\r' | sed -n 's/^ETag: //Ip')
cmp -s "$work/alice-phone.mlmodel" "$work/alice.mlmodel" && same="the same bytes as the export" || same="NOT the export's bytes"
echo "  alice's model with her token: 200, ETag $etag, $same"
echo "  asked again with that ETag: $(status -H "Authorization: Bearer $alice_token" -H "If-None-Match: $etag" "$device/v1/models/digits/users/alice")"
echo "  bob's model with alice's token: $(status -H "Authorization: Bearer $alice_token" "$device/v1/models/digits/users/bob")"
echo "  alice's model with no token: $(status "$device/v1/models/digits/users/alice")"
echo "  the dashboard on the device port: $(status "$device/")"
echo "  the dashboard on the admin listener, no credential: $(status "http://127.0.0.1:$admin_port/"), as operator ops: $(status -u 'ops:a long demo operator password' "http://127.0.0.1:$admin_port/")"
echo "== a better base ships (64-48-10, trained longer on the same other writers): every user's kept jobs replayed onto it"
"$attune" model rebase --name digits --base examples/models/digits-pretrained-v2.mlmodel
"$attune" model rebase-status --name digits --wait --timeout 300
echo "== held-out accuracy: personal on base 1 (above), the new base alone, rebased onto the new base"
for i in "${!users[@]}"; do
  "$attune" model evaluate --name digits --csv "$data" --rows "$(test_rows "$i")" | sed "s/^/  ${users[$i]}, the new base alone: /"
  "$attune" model evaluate --name digits --user "${users[$i]}" --csv "$data" --rows "$(test_rows "$i")" | sed "s/^/  ${users[$i]}, rebased: /"
done
"$attune" model history --name digits --user alice | tail -n 1
echo "  alice's phone asks with the ETag it holds: $(status -H "Authorization: Bearer $alice_token" -H "If-None-Match: $etag" "$device/v1/models/digits/users/alice") (her rebased model)"
echo "== stopping workers (SIGTERM)"
