"""`make bench`: run every benchmark in this folder, one after the other, and print their figures.

Each bench_*.py is a standalone script that measures tailgate side by side with a
peer in the same run and prints ratios; see its docstring for what it measures.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n=== {script.name} ===", flush=True)
        rc = subprocess.run([sys.executable, str(script)], check=False).returncode
        if rc:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
