#!/usr/bin/env bash
# Make sure redis-server is on PATH: install it with apt-get when we are root on
# Debian/Ubuntu, otherwise say how to get it.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "redis-server not found: installing it with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  # the package may start a system service on 6379; Sluice starts its own servers
  command -v redis-server >/dev/null 2>&1 && exit 0
fi
cat >&2 <<'MSG'
redis-server is required but was not found on PATH.
  Debian/Ubuntu: sudo apt-get install redis-server
  macOS:         brew install redis
  or set SLUICE_TEST_REDIS_URL (tests) / SLUICE_REDIS_URL (demo) to a running server.
MSG
exit 1
