#!/usr/bin/env bash
# Make sure the versitygw S3 server (the object store of the lake's tests and of
# `sluice demo --lake s3`) is built and cached, keyed by version, under
# ~/.cache/sluice-versitygw/<version>/ (or $SLUICE_VERSITYGW_CACHE/<version>/).
# A fresh machine builds it once from the Go module proxy (~15 min on 2 busy cores).
set -euo pipefail
VERSION="v1.8.0"
DIR="${SLUICE_VERSITYGW_CACHE:-$HOME/.cache/sluice-versitygw}/$VERSION"
if [ -x "$DIR/versitygw" ]; then
  exit 0
fi
if ! command -v go >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "go not found: installing golang-go with apt-get (to build versitygw)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends golang-go >/dev/null
  fi
fi
if ! command -v go >/dev/null 2>&1; then
  cat >&2 <<MSG
versitygw $VERSION is required for the object-store lake tests and was not found in $DIR,
and there is no Go toolchain to build it. Install Go, then:
  GOBIN=$DIR go install github.com/versity/versitygw/cmd/versitygw@$VERSION
MSG
  exit 1
fi
echo "sluice: building versitygw $VERSION into $DIR (once; ~15 min of compiling)" >&2
mkdir -p "$DIR"
GOBIN="$DIR" go install "github.com/versity/versitygw/cmd/versitygw@$VERSION"
