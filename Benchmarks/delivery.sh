#!/usr/bin/env bash
# The device path under load, with nginx as the anchor: wrk (Debian's) on loopback against `attune serve`
# (release build) and against nginx-light serving the same bytes as a static file with its own ETag, in
# one run, each case in turn A B A B. Cases: conditional GETs answered 304 (what a device polling "is there
# a newer model?" costs), full GETs of alice's personal model (base + her update state, built once and then
# cached by ETag), and 401s (no token, a forged token). Prints one table; nothing is asserted.
#
#   Benchmarks/delivery.sh [--seconds S] [--connections C] [--rounds R]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=8 connections=64 rounds=2
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift ;;
    --connections) connections=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    *) echo "delivery.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
missing=()
command -v wrk >/dev/null || missing+=(wrk)
[ -x /usr/sbin/nginx ] || missing+=(nginx-light)
if ((${#missing[@]})); then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
    { apt-get update -qq >&2; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2; }
fi
source scripts/fleet-session.sh delivery-bench

echo "== alice's personal model: one job through a worker"
"$attune" model import examples/models/digits-pretrained.mlmodel --name digits >/dev/null
"$attune" worker --name bench-worker >"$work/worker.log" 2>&1 & pids+=($!)
"$attune" enqueue --model digits --user alice --csv examples/data/digits.csv.gz --rows 1200:1260 --format json >/dev/null
for _ in $(seq 300); do
  [ "$("$attune" model history --name digits --user alice | tail -n +2 | wc -l)" -ge 1 ] && break
  sleep 0.2
done
"$attune" model export --name digits --user alice -o "$work/alice.mlmodel" >/dev/null
"$attune" app key create --app bench --model digits > "$work/bench.jwk" 2>/dev/null
token=$("$attune" token device --key-file "$work/bench.jwk" --user alice --ttl 1h)

device_port=$(scripts/free-port)
"$attune" serve --host 127.0.0.1 --port "$device_port" --no-dashboard >"$work/serve.log" 2>&1 & pids+=($!)
attune_url=http://127.0.0.1:$device_port/v1/models/digits/users/alice
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$device_port/healthz" >/dev/null && break; sleep 0.1; done
attune_etag=$(curl -s -D - -o "$work/served.mlmodel" -H "Authorization: Bearer $token" "$attune_url" | tr -d '\r' | sed -n 's/^ETag: //Ip')
cmp -s "$work/served.mlmodel" "$work/alice.mlmodel" || { echo "served bytes differ from the export" >&2; exit 1; }

# nginx: the same bytes as a static file, ETag from its size and mtime, one worker per core like serve's
# event loops, no access log (serve keeps none either).
mkdir -p "$work/nginx/www" "$work/nginx/tmp"
cp "$work/alice.mlmodel" "$work/nginx/www/alice.mlmodel"
nginx_port=$(scripts/free-port)
cat >"$work/nginx/nginx.conf" <<EOF
worker_processes auto;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $work/nginx/tmp; proxy_temp_path $work/nginx/tmp; fastcgi_temp_path $work/nginx/tmp;
  uwsgi_temp_path $work/nginx/tmp; scgi_temp_path $work/nginx/tmp;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$nginx_port;
    location / { root $work/nginx/www; etag on; default_type application/octet-stream; }
  }
}
EOF
chmod -R o+rX "$work/nginx"
/usr/sbin/nginx -c "$work/nginx/nginx.conf" -g 'daemon off;' & pids+=($!)
nginx_url=http://127.0.0.1:$nginx_port/alice.mlmodel
for _ in $(seq 50); do curl -sf -o /dev/null "$nginx_url" && break; sleep 0.1; done
nginx_etag=$(curl -s -D - -o /dev/null "$nginx_url" | tr -d '\r' | sed -n 's/^ETag: //Ip')
echo "== attune ETag $attune_etag, nginx ETag $nginx_etag, $(wc -c <"$work/alice.mlmodel") bytes"

# One wrk run: prints "requests/s p50 p99". The answer's status is checked with curl first; during the run
# wrk counts answers outside 2xx/3xx, which must be none (200, 304) or all (401).
run() {
  local url=$1 expect=$2; shift 2
  local curl_headers=() h
  for h in "$@"; do [ "$h" = -H ] || curl_headers+=(-H "$h"); done
  local got
  got=$(curl -s -o /dev/null -w '%{http_code}' "${curl_headers[@]}" "$url")
  [ "$got" = "$expect" ] || { echo "expected $expect from $url, got $got" >&2; exit 1; }
  local out rps p50 p99 total errors
  out=$(wrk -t2 -c"$connections" -d"${seconds}s" --latency "$@" "$url" 2>&1)
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  errors=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  if [ "$expect" = 401 ]; then
    [ "${errors:-0}" = "$total" ] || { echo "not every answer was 401: $out" >&2; exit 1; }
  else
    [ -z "$errors" ] || { echo "some answers were not $expect: $out" >&2; exit 1; }
  fi
  echo "$rps $p50 $p99"
}
declare -A results=()
cases=(attune_304 nginx_304 attune_200 nginx_200 attune_401_none attune_401_forged)
for round in $(seq "$rounds"); do
  for c in "${cases[@]}"; do
    case $c in
      attune_304) r=$(run "$attune_url" 304 -H "Authorization: Bearer $token" -H "If-None-Match: $attune_etag") ;;
      nginx_304) r=$(run "$nginx_url" 304 -H "If-None-Match: $nginx_etag") ;;
      attune_200) r=$(run "$attune_url" 200 -H "Authorization: Bearer $token") ;;
      nginx_200) r=$(run "$nginx_url" 200) ;;
      attune_401_none) r=$(run "$attune_url" 401) ;;
      attune_401_forged) r=$(run "$attune_url" 401 -H "Authorization: Bearer ${token%?????}AAAAA") ;;
    esac
    results[$c.$round]=$r
    echo "  round $round $c: $r" >&2
  done
done

echo
echo "| case | round | requests/s | p50 | p99 | attune / nginx |"
echo "| --- | --- | --- | --- | --- | --- |"
for round in $(seq "$rounds"); do
  for c in "${cases[@]}"; do
    read -r rps p50 p99 <<<"${results[$c.$round]}"
    ratio=""
    case $c in
      attune_304) read -r peer _ <<<"${results[nginx_304.$round]}"; ratio=$(python3 -c "print(f'{$rps / $peer:.2f}')") ;;
      attune_200) read -r peer _ <<<"${results[nginx_200.$round]}"; ratio=$(python3 -c "print(f'{$rps / $peer:.2f}')") ;;
    esac
    echo "| $c | $round | $rps | $p50 | $p99 | $ratio |"
  done
done
echo
echo "wrk -t2 -c$connections -d${seconds}s on loopback, $(nproc) cores shared by wrk, the server and PostgreSQL; serve: release build"
