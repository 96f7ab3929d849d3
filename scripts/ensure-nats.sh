#!/usr/bin/env bash
# Bench-only: make sure nats-server (the NATS core request-reply baseline of
# `make bench B=bus`) is built and cached, keyed by version, under
# ~/.cache/sluice-nats/<version>/ (or $BENCH_NATS_CACHE/<version>/), and that the
# NATS Python client (nats-py, the `bench` extra) is in the virtualenv. `make test`
# needs neither. A fresh machine builds nats-server once from the Go module proxy.
set -euo pipefail
VERSION="v2.15.2"
DIR="${BENCH_NATS_CACHE:-$HOME/.cache/sluice-nats}/$VERSION"
PY="${1:-.venv/bin/python}"
if ! "$PY" -c "import nats" 2>/dev/null; then
  echo "sluice: installing nats-py into the virtualenv at the tested version (constraints.txt; bench only)" >&2
  PYTHONWARNINGS=ignore "$PY" -m pip install -q -c constraints.txt -e '.[bench]'
fi
if [ -x "$DIR/nats-server" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<MSG
nats-server $VERSION (the NATS baseline of the bus benchmark) was not found in $DIR,
and there is no Go toolchain to build it. Install Go, then:
  GOBIN=$DIR go install github.com/nats-io/nats-server/v2@$VERSION
MSG
  exit 1
fi
echo "sluice: building nats-server $VERSION into $DIR (once, bench only)" >&2
mkdir -p "$DIR"
GOBIN="$DIR" go install "github.com/nats-io/nats-server/v2@$VERSION"
