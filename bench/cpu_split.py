"""Where a run's CPU goes: run a command, sample /proc, print CPU seconds and peak RSS per
kind of process (the driver, its JVM, Spark's Python workers, Postgres backends, the Kafka
broker), including the services the command only talks to.

    .venv/bin/python -m bench.cpu_split python -m pipeline run --config C --json
    PGSPLIT=1 .venv/bin/python -m bench.cpu_split ...   # Postgres by process title

Every process on the machine is counted (that is how the services are): run it on a
quiet machine. Used for docs/benchmarks.md ("where the CPU goes"). Processes that exit
between two samples lose up to 0.2 s of CPU each; on this machine that is noise.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import threading
import time

TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def snapshot() -> dict[int, tuple[str, float, float]]:
    """pid -> (command line, CPU seconds so far, RSS MB)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry)] = (cmd, (int(fields[11]) + int(fields[12])) / TICK,
                           int(fields[21]) * PAGE / 2**20)
    return out


def kind(cmd: str) -> str:
    if "postgres" in cmd:
        if os.environ.get("PGSPLIT"):
            return "postgres: " + " ".join(re.sub(r"\(\d+\)", "", cmd).split()[1:4])
        return "postgres"
    if "kafka.Kafka" in cmd:
        return "kafka broker"
    if "pyspark.daemon" in cmd or "pyspark.worker" in cmd:
        return "spark python workers"
    if "java" in cmd:
        return "driver JVM"
    if "python" in cmd:
        return "driver python"
    # A worker that exited between samples has an empty command line at its last sample.
    return "exited (mostly spark python workers)" if not cmd.strip() else "other"


def main(argv: list[str]) -> int:
    base = snapshot()
    last: dict[int, tuple[str, float]] = {}
    peak: collections.Counter = collections.Counter()
    started = time.monotonic()
    proc = subprocess.Popen(argv)
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            rss: collections.Counter = collections.Counter()
            for pid, (cmd, cpu, mb) in snapshot().items():
                last[pid] = (cmd, cpu)
                rss[kind(cmd)] += mb
            for k, mb in rss.items():
                peak[k] = max(peak[k], mb)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    done.set()
    sampler.join()
    wall = time.monotonic() - started
    cpu: collections.Counter = collections.Counter()
    for pid, (cmd, seconds) in last.items():
        before = base.get(pid)
        cpu[kind(cmd)] += seconds - (before[1] if before and before[0] == cmd else 0)
    print(f"cpu_split: wall {wall:.1f} s, exit {rc}", file=sys.stderr)
    for k, seconds in sorted(cpu.items(), key=lambda item: -item[1]):
        if seconds >= 0.1 and k != "other":
            print(f"cpu_split: {k:38s} {seconds:7.1f} s CPU, peak RSS {peak[k]:6.0f} MB",
                  file=sys.stderr)
    print(f"cpu_split: total {sum(cpu.values()):.1f} s CPU on {os.cpu_count()} cores",
          file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
