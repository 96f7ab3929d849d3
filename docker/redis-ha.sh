#!/bin/sh
# redis-ha.sh server|sentinel: start one Redis data node or one Sentinel of
# docker/compose.production.yaml (the redis image runs it; it is mounted there).
#
# The config file is written on the first start only, on the node's own volume:
# after that, Redis and Sentinel rewrite it themselves (a failover's CONFIG
# REWRITE), so a restarted node comes back with the role and master it last had,
# not the first ones.
#
#   REDIS_PASSWORD        the data nodes' password (required; replicas and Sentinels
#                         use it for the master). Letters, digits, - and _ only: it
#                         goes into URLs (SLUICE_REDIS_URL, Celery's broker URL).
#   REDIS_HA_MASTER      host:port of the first master (default redis-1:6379)
#   REDIS_HA_NAME        the Sentinels' name for it (default sluice)
#   REDIS_HA_ANNOUNCE    this node's host name as the others reach it (default: hostname)
#   REDIS_HA_PORT        the port (default 6379 for a data node, 26379 for a Sentinel)
#   REDIS_HA_DIR         where the config file and the data live (default /data)
#   REDIS_HA_QUORUM      Sentinels that must agree a master is down (default 2)
#   REDIS_HA_DOWN_AFTER_MS  a master silent this long is down (default 5000)
set -eu
role=${1:-}
case "$role" in server | sentinel) ;; *)
  echo "usage: redis-ha.sh server|sentinel" >&2
  exit 2
  ;;
esac
password=${REDIS_PASSWORD:-}
if [ -z "$password" ]; then
  echo "redis-ha.sh: REDIS_PASSWORD is not set" >&2
  exit 2
fi
case "$password" in *[!A-Za-z0-9_-]*)
  echo "redis-ha.sh: REDIS_PASSWORD may hold letters, digits, - and _ only (it goes into URLs)" >&2
  exit 2
  ;;
esac
master=${REDIS_HA_MASTER:-redis-1:6379}
master_host=${master%:*}
master_port=${master##*:}
name=${REDIS_HA_NAME:-sluice}
me=${REDIS_HA_ANNOUNCE:-$(hostname)}
dir=${REDIS_HA_DIR:-/data}
mkdir -p "$dir"

if [ "$role" = server ]; then
  port=${REDIS_HA_PORT:-6379}
  conf=$dir/redis.conf
  if [ ! -s "$conf" ]; then
    {
      echo "port $port"
      echo "dir $dir"
      echo "appendonly yes"
      echo "requirepass $password"
      echo "masterauth $password"
      echo "replica-announce-ip $me"
      echo "replica-announce-port $port"
      if [ "$me:$port" != "$master_host:$master_port" ]; then
        echo "replicaof $master_host $master_port"
      fi
    } > "$conf.tmp"
    mv "$conf.tmp" "$conf"
    echo "redis-ha.sh: wrote $conf"
  fi
  exec redis-server "$conf"
fi

port=${REDIS_HA_PORT:-26379}
conf=$dir/sentinel.conf
if [ ! -s "$conf" ]; then
  {
    echo "port $port"
    echo "dir $dir"
    # host names, not container addresses (those change when a container is made again)
    echo "sentinel resolve-hostnames yes"
    echo "sentinel announce-hostnames yes"
    echo "sentinel announce-ip $me"
    echo "sentinel announce-port $port"
    echo "sentinel monitor $name $master_host $master_port ${REDIS_HA_QUORUM:-2}"
    echo "sentinel auth-pass $name $password"
    echo "sentinel down-after-milliseconds $name ${REDIS_HA_DOWN_AFTER_MS:-5000}"
    echo "sentinel failover-timeout $name 30000"
  } > "$conf.tmp"
  mv "$conf.tmp" "$conf"
  echo "redis-ha.sh: wrote $conf"
fi
exec redis-server "$conf" --sentinel
