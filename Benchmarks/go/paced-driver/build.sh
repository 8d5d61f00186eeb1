#!/usr/bin/env bash
# Builds the paced driver offline, in GOPATH mode against Debian's golang-go and
# golang-github-rabbitmq-amqp091-go-dev (scripts/install-deps.sh), as examples/go does: nothing is downloaded.
#   Benchmarks/go/paced-driver/build.sh OUTPUT
# GOCACHE: Go's build cache (default ~/.cache/attune/go-build, so a bench's later builds take a second or two).
set -euo pipefail
out=$(realpath -m "${1:?usage: build.sh OUTPUT}")
cd "$(dirname "$0")"
command -v go >/dev/null || { echo "go is not installed: run scripts/install-deps.sh" >&2; exit 1; }
[ -d /usr/share/gocode/src/github.com/rabbitmq/amqp091-go ] ||
  { echo "amqp091-go is not installed: run scripts/install-deps.sh" >&2; exit 1; }
GO111MODULE=off GOPATH=/usr/share/gocode GOFLAGS= GOCACHE=${GOCACHE:-$HOME/.cache/attune/go-build} \
  go build -o "$out" .
