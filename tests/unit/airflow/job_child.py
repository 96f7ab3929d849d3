"""A real child process for the lake-job runner tests: ``job_child BEHAVIOUR [ARGS]``.

Run through the runner's bootstrap as ``module``; each behaviour is one way a
lake job can end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    what, args = argv[0], argv[1:]
    if what == "ok":
        sys.stderr.write("starting\nworking on it\n")
        sys.stdout.write("log noise on stdout\n")
        sys.stdout.write(
            json.dumps({"job": "ok", "args": args, "env": os.environ.get("SLUICE_TEST_X")})
        )
        return 0
    if what == "archive-streams":
        # each --stream archived, or failed when SLUICE_TEST_X=fail (exit 1 with the result)
        names = [args[i + 1] for i, a in enumerate(args) if a == "--stream"]
        error = os.environ.get("SLUICE_TEST_X") == "fail"
        streams = {
            n: {"stream": n, "error": "it broke"} if error else {"stream": n, "entries": 2}
            for n in names
        }
        failed = names if error else []
        sys.stdout.write(json.dumps({"streams": streams, "failed": failed, "args": args}))
        return 1 if error else 0
    if what == "pretty":
        sys.stdout.write(json.dumps({"rows": [1, 2, 3]}, indent=2))
        return 0
    if what == "fail":
        sys.stderr.write("sluice lake: stream 'x' does not exist\n")
        sys.stderr.write("INFO py4j.clientserver: Closing down clientserver connection\n")
        return 3
    if what == "report":
        sys.stdout.write(json.dumps({"ok": False, "gaps": [[3, 4]]}) + "\n")
        return 1
    if what == "garbage":
        sys.stdout.write("this is not json\n")
        return 0
    if what == "hang":
        # A grandchild in the same process group, like the JVM of a Spark job.
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(args[0], "w") as fh:
            fh.write(f"{os.getpid()} {grandchild.pid}")
        time.sleep(600)
        return 0
    if what == "orphan":
        # Exits at once but leaves a grandchild holding the pipes open.
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(args[0], "w") as fh:
            fh.write(str(grandchild.pid))
        sys.stdout.write('{"done": true}\n')
        return 0
    sys.stderr.write(f"unknown behaviour {what}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
