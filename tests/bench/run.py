"""Run benchmarks: ``python tests/bench/run.py [name]`` runs bench_<name>.py, or all of them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    names = argv or sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))
    failed = 0
    for name in names:
        script = HERE / f"bench_{name}.py"
        if not script.exists():
            print(f"no benchmark named {name!r} ({script} is missing)", file=sys.stderr)
            return 2
        print(f"# bench {name}", file=sys.stderr, flush=True)
        failed |= subprocess.call([sys.executable, str(script)], cwd=HERE.parents[1])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
