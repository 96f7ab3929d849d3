"""Health probe for docker/compose.yaml: exit 0 when GET URL answers 2xx within 5 s, else 1.

    python /opt/sluice/docker/probe.py http://127.0.0.1:8765/healthz

The image has no curl; this needs only the standard library.
"""

import sys
import urllib.error
import urllib.request

try:
    with urllib.request.urlopen(sys.argv[1], timeout=5) as reply:
        sys.exit(0 if 200 <= reply.status < 300 else 1)
except (urllib.error.URLError, OSError, IndexError) as exc:
    sys.stderr.write(f"probe: {exc}\n")
    sys.exit(1)
