#!/usr/bin/env bash
# Make sure toxiproxy-server (the network-fault proxy of the history checker's nemesis
# tests: latency, cut, half-open, slow, reset) is built and cached, keyed by version,
# under ~/.cache/sluice-toxiproxy/<version>/ (or $SLUICE_TOXIPROXY_CACHE/<version>/).
# A fresh machine builds it once from the Go module proxy (the package's binary is
# called `server`; it is renamed toxiproxy-server). A no-op when it is there.
set -euo pipefail
VERSION="v2.12.0"
MODULE="github.com/Shopify/toxiproxy/v2/cmd/server"
DIR="${SLUICE_TOXIPROXY_CACHE:-$HOME/.cache/sluice-toxiproxy}/$VERSION"
if [ -x "$DIR/toxiproxy-server" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "go not found: installing golang-go with apt-get (to build toxiproxy)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends golang-go >/dev/null
  fi
fi
if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<MSG
toxiproxy-server $VERSION is required for the network-fault tests and was not found in $DIR,
and there is no Go toolchain to build it. Install Go, then:
  GOBIN=$DIR go install $MODULE@$VERSION && mv $DIR/server $DIR/toxiproxy-server
MSG
  exit 1
fi
echo "sluice: building toxiproxy-server $VERSION into $DIR (once; about a minute of compiling)" >&2
mkdir -p "$DIR"
# build into a scratch GOBIN, then move into place: a half-done build never looks installed
TMP="$(mktemp -d "$DIR/.build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
LOG="$TMP/go-install.log"
for attempt in 1 2 3; do
  if GOBIN="$TMP" GOFLAGS="${GOFLAGS:--buildvcs=false}" go install "$MODULE@$VERSION" >"$LOG" 2>&1; then
    break
  fi
  if [ "$attempt" = 3 ]; then
    echo "sluice: building toxiproxy-server $VERSION failed (go install $MODULE@$VERSION): $(tail -n 1 "$LOG")" >&2
    exit 1
  fi
  sleep $((attempt * 5))
done
mv "$TMP/server" "$DIR/toxiproxy-server"
