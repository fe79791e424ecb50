"""``pipeline verify`` in bounded memory (issue 28): the peak RSS of the verify process does
not grow with the records verified. Two topics of 2 KB records, one five times the other
(40 MB and 200 MB of values), are ingested and verified on the driver (``--spark never``:
every record is read twice in this process, by the offset checks and by the ledger's
hashes); if verify kept the records, or even their offsets, the second would peak far
higher. librdkafka's prefetch queue is capped (8 MB) so that both topics outgrow it: what
stays is the size-independent part (interpreter, libraries, one queue and one batch)."""

from __future__ import annotations

import subprocess
import sys

from pipeline.driver.job import run_ingest
from tests.helpers import (
    ROOT,
    create_topic,
    make_settings,
    order,
    produce,
    toml_config,
    unique,
)
from tests.integration._reliability import init_db

PAD = "x" * 2000
# The child verifies in-process and reports its own peak RSS (kB) as the last line: VmHWM
# of its address space, not getrusage's ru_maxrss, which Linux carries across exec from
# the forked parent (this test process, whose size would then be measured).
CHILD = """
import sys
from pipeline.cli import main
code = main(["verify", "--config", sys.argv[1], "--spark", "never", "--json"])
status = open("/proc/self/status").read()
print(code, status.split("VmHWM:")[1].split()[0], file=sys.stderr)
"""
CAP = '[kafka.consumer]\n"queued.max.messages.kbytes" = "8192"\n'


def peak_rss_of_verify(config) -> tuple[int, int]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(config)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    last = (done.stderr.strip().splitlines() or [""])[-1].split()
    assert len(last) == 2 and done.returncode == 0, done.stderr[-3000:]
    return int(last[0]), int(last[1]) * 1024


def test_verify_peak_memory_does_not_grow_with_the_records(spark, tmp_path):
    peaks = {}
    for n in (20_000, 100_000):
        topic = create_topic(unique("vmem"), 2)
        produce(topic, [(b"k", order(i, pad=PAD)) for i in range(n)])
        s = init_db(make_settings(unique("vmem"), [topic]))
        assert run_ingest(s).rows_written == n
        config = tmp_path / f"vmem{n}.toml"
        config.write_text(toml_config(s.name, [topic], db_url=s.database_url,
                                      extra_kafka=CAP))
        code, peaks[n] = peak_rss_of_verify(config)
        assert code == 0
    # 160 MB more values read twice; kept, they would show here many times over.
    grown = peaks[100_000] - peaks[20_000]
    print(f"verify peak RSS: {peaks[20_000] >> 20} MB for 20,000 records, "
          f"{peaks[100_000] >> 20} MB for 100,000")
    assert grown < 40 << 20, f"peak RSS {peaks}: grew {grown >> 20} MB with the records"
