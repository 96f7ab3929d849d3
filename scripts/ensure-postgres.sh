#!/usr/bin/env bash
# Make sure PostgreSQL's server programs (initdb, postgres, pg_isready, createdb) are
# installed: Airflow's metadata database in the tests that run a real scheduler or API
# server, and in `make demo`. Installs Debian's postgresql with apt-get when we are root
# on Debian/Ubuntu, otherwise says how to get it. Sluice starts its own private servers.
set -euo pipefail
if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "PostgreSQL not found: installing postgresql with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && exit 0
fi
cat >&2 <<'MSG'
PostgreSQL's server programs are required but were not found.
  Debian/Ubuntu: sudo apt-get install postgresql
  macOS:         brew install postgresql
MSG
exit 1
