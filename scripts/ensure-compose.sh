#!/usr/bin/env bash
# Make sure a Compose implementation can check docker/compose.yaml
# (tests/unit/test_docker_compose.py runs its `config`): the docker CLI's
# compose plugin, or else Debian's docker-compose installed with apt-get when we
# are root. No Docker engine is needed for `config`. Without either, the test
# checks the file's structure only and says so.
set -euo pipefail
if docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "no docker compose: installing Debian's docker-compose with apt-get (for 'config' checks)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
  command -v docker-compose >/dev/null 2>&1 && exit 0
fi
echo "no docker compose found; docker/compose.yaml is checked without 'config' validation" >&2
exit 0
