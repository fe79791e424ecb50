"""Where a command's CPU goes, by thread: run it, sample /proc/<pid>/task/* of it and every
descendant every 0.3 s, print CPU-seconds per thread name (digits dropped, so "C2
CompilerThread0" and "C1 CompilerThread1" are one line: "C CompilerThread"), prefixed by
the kind of process (jvm, Spark's Python workers, the driver's Python).

    .venv/bin/python -m bench.thread_cpu python -m pipeline run --config C --json

Used for docs/benchmarks.md ("Transform path: where the JVM's CPU goes"): it showed the
JIT compiler threads spending more CPU than the tasks themselves. A thread that exits
between two samples loses up to 0.3 s.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def descendants(root: int) -> list[int]:
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                pass
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += [c for c, pp in parent.items() if pp == pid]
    return out


def sample(root: int, seen: dict) -> None:
    for pid in descendants(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            kind = ("jvm" if b"java" in cmd else "python workers" if b"pyspark" in cmd
                    else "driver python")
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
                name = re.sub(r"[\d#-]+", "", stat[stat.index("(") + 1:stat.rindex(")")])
                fields = stat.rsplit(")", 1)[1].split()
                seen[(pid, int(tid))] = (f"{kind}: {name.strip()}",
                                         (int(fields[11]) + int(fields[12])) / TICK)
        except OSError:
            pass


def main(argv: list[str]) -> int:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict = {}
    while proc.poll() is None:
        sample(proc.pid, seen)
        time.sleep(0.3)
    by_name: collections.Counter = collections.Counter()
    for name, cpu in seen.values():
        by_name[name] += cpu
    for name, cpu in by_name.most_common(12):
        print(f"{cpu:7.1f}  {name}")
    print(f"{sum(by_name.values()):7.1f}  total (exit code {proc.returncode})")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
