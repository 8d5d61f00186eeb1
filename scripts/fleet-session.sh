# Sourced by scripts/demo.sh and Benchmarks/fleet.sh (from the repository root): installs what is missing, builds the
# release binary into $attune, starts throwaway servers in the temporary folder $work, and on exit
# sends SIGTERM to every process listed in $pids, stops the servers and removes the folder.
scripts/install-deps.sh
if [ -n "${ATTUNE_BIN:-}" ]; then
  # A binary built elsewhere (a benchmark comparing two builds names it).
  attune=$ATTUNE_BIN
else
  echo "== building (release)"
  swift build -c release --product attune 2>&1 | tail -n 1
  attune=$PWD/.build/release/attune
fi
work=$(mktemp -d "/tmp/attune-${1:-session}.XXXXXX")
chmod 755 "$work"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  scripts/services.sh stop "$work" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
echo "== starting throwaway PostgreSQL and RabbitMQ in $work"
services=$(scripts/services.sh start "$work" 2>"$work/services.log") || { cat "$work/services.log" >&2; exit 1; }
eval "$services"
"$attune" migrate >/dev/null
