#!/usr/bin/env bash
# Installs what Attune needs on a Debian bookworm machine (idempotent; quiet when all is there).
#   scripts/install-deps.sh            servers (PostgreSQL with pg_auto_failover for the HA set), C libraries for the build
#   scripts/install-deps.sh --python   also a virtual environment with numpy, Pillow, coremltools, pika and dp-accounting (for the tests)
#   scripts/install-deps.sh --browser  also chromium, its driver and selenium (the dashboard's browser test)
#   scripts/install-deps.sh --profiling  also tcpdump and perf (Benchmarks/fleet.sh --only costs)
# examples/go builds offline from Debian's Go and its amqp091-go sources (GOPATH mode, /usr/share/gocode).
# Needs root for apt-get (CI and the dev machines run as root). The Swift 6 toolchain itself is not a
# Debian package: it must already be on PATH (swift.org's Linux tarball, or the machine image).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
packages=(postgresql postgresql-contrib postgresql-15-auto-failover pg-auto-failover-cli rabbitmq-server librabbitmq-dev libpq-dev libblis-pthread-dev libpng-dev libturbojpeg0-dev
          python3-venv gzip openssl libjs-chart.js protobuf-compiler curl
          golang-go golang-github-rabbitmq-amqp091-go-dev pgbackrest)
[[ " $* " == *" --browser "* ]] && packages+=(chromium chromium-driver)
[[ " $* " == *" --profiling "* ]] && packages+=(tcpdump linux-perf)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
command -v swift >/dev/null || { echo "swift is not on PATH: install the Swift 6 toolchain first" >&2; exit 1; }

if [[ " $* " == *" --python "* || " $* " == *" --browser "* ]]; then
  venv=${ATTUNE_VENV:-$here/.venv}
  if ! "$venv/bin/python" -c "import numpy, coremltools, PIL" 2>/dev/null; then
    echo "creating $venv with numpy, Pillow and coremltools 9.0" >&2
    python3 -m venv "$venv" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check numpy pillow coremltools==9.0 >&2
  fi
  # examples/python (run by the tests) publishes and consumes with pika, and signs device tokens with PyJWT.
  if ! "$venv/bin/python" -c "import pika, jwt, cryptography" 2>/dev/null; then
    "$venv/bin/pip" install -q --disable-pip-version-check pika "pyjwt[crypto]" >&2
  fi
  # clients/python/run-tests.sh runs the Python client's tests with pytest and type-checks it with mypy --strict.
  if ! "$venv/bin/python" -c "import pytest, mypy" 2>/dev/null; then
    "$venv/bin/pip" install -q --disable-pip-version-check pytest mypy >&2
  fi
  # Tests/python/dp_accounting_check.py holds attune's privacy accountant to Google's dp-accounting. That package
  # pins attrs below 24, which would downgrade the attrs coremltools' cattrs needs (25.4 or later); it runs on the
  # newer attrs, so its other dependencies are installed and it alone without its pins, at the version checked.
  if ! "$venv/bin/python" -c "import dp_accounting.rdp" 2>/dev/null; then
    "$venv/bin/pip" install -q --disable-pip-version-check scipy absl-py dm-tree mpmath >&2
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps dp-accounting==0.6.0 >&2
  fi
fi
if [[ " $* " == *" --browser "* ]]; then
  venv=${ATTUNE_VENV:-$here/.venv}
  "$venv/bin/python" -c "import selenium" 2>/dev/null ||
    "$venv/bin/pip" install -q --disable-pip-version-check selenium >&2
fi
