#!/bin/sh
# One-shot preparation for docker/compose.yaml and docker/compose.production.yaml (the
# `init` service), idempotent: what exists is kept, so restarts and `docker compose up`
# again change nothing.
#   - the bus: this twin's Ed25519 key and the twin directory (twins.json);
#   - Airflow: the JWT secret and the API secret key every Airflow component shares;
#   - the lake: its bucket on the S3 server (an s3:// SLUICE_LAKE_URI), else its directory;
#   - with PROMETHEUS_SECRETS_DIR and SLUICE_SERVE_TOKEN set: the serve token as a file
#     Prometheus reads there (rewritten each time: the environment is its source).
# Secrets live only on the `secrets` volume (never in the image or the build context).
set -eu
SECRETS="${SLUICE_SECRETS_DIR:-/run/sluice}"
TWIN="${SLUICE_BUS_TWIN:-1}"
BUS_URL="${SLUICE_BUS_URL:-http://bus:8051}"
if [ -n "${PROMETHEUS_SECRETS_DIR:-}" ] && [ -z "${SLUICE_SERVE_TOKEN:-}" ]; then
  echo "init: PROMETHEUS_SECRETS_DIR is set but SLUICE_SERVE_TOKEN is not" >&2
  exit 2
fi
umask 077
mkdir -p "$SECRETS"
case "${SLUICE_LAKE_URI:-/lake}" in
  s3://*)
    # The bucket through the S3 API, with the lake's own settings (SLUICE_LAKE_S3_*).
    python - <<'PY'
from urllib.parse import urlparse
import pyarrow.fs as pafs
from pipeline.settings import Settings
lake = Settings.load().lake
options, bucket = lake.storage_options(), urlparse(lake.uri).netloc
endpoint = urlparse(options.get("AWS_ENDPOINT_URL", ""))
fs = pafs.S3FileSystem(
    access_key=options.get("AWS_ACCESS_KEY_ID"), secret_key=options.get("AWS_SECRET_ACCESS_KEY"),
    region=options["AWS_REGION"], endpoint_override=endpoint.netloc or None,
    scheme=endpoint.scheme or "https", allow_bucket_creation=True,
)
if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
    fs.create_dir(bucket)
    print(f"init: created the lake's bucket {bucket}")
PY
    ;;
  *) mkdir -p "${SLUICE_LAKE_URI:-/lake}" ;;
esac

for name in airflow_jwt_secret airflow_api_secret; do
  if [ ! -s "$SECRETS/$name" ]; then
    python -c 'import secrets; print(secrets.token_urlsafe(48))' > "$SECRETS/$name.tmp"
    mv "$SECRETS/$name.tmp" "$SECRETS/$name"
    echo "init: created $SECRETS/$name"
  fi
done

KEY="$SECRETS/twin$TWIN.key"
if [ ! -s "$KEY" ]; then
  sluice bus keygen --out "$KEY" > /dev/null
  echo "init: created the key of twin $TWIN"
fi
# The directory is rewritten from the key every time: it can never go stale.
python - "$KEY" "$TWIN" "$BUS_URL" "$SECRETS/twins.json" <<'PY'
import json, os, sys
from pipeline.bus.signing import Signer
key, twin, url, out = sys.argv[1:]
doc = {twin: {"url": url, "key": Signer.from_file(key).public_key}}
with open(out + ".tmp", "w") as f:
    json.dump(doc, f, indent=2)
os.replace(out + ".tmp", out)
os.chmod(out, 0o644)  # public keys only
print(f"init: twin directory {out}: {sorted(doc)}")
PY
if [ -n "${PROMETHEUS_SECRETS_DIR:-}" ]; then
  # Prometheus runs as another user: its directory and file are readable, its volume its own
  mkdir -p "$PROMETHEUS_SECRETS_DIR"
  chmod 755 "$PROMETHEUS_SECRETS_DIR"
  printf '%s' "$SLUICE_SERVE_TOKEN" > "$PROMETHEUS_SECRETS_DIR/serve_token.tmp"
  chmod 644 "$PROMETHEUS_SECRETS_DIR/serve_token.tmp"
  mv "$PROMETHEUS_SECRETS_DIR/serve_token.tmp" "$PROMETHEUS_SECRETS_DIR/serve_token"
  echo "init: the serve token for Prometheus in $PROMETHEUS_SECRETS_DIR"
fi
echo "init: done"
