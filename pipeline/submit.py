"""spark-submit entry point: ``spark-submit pipeline/submit.py run --config conf/local.toml``
(no connector jars: every run reads with confluent-kafka) does the same run as ``pipeline
run``, with the same exit codes.
"""

import os
import signal
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Python puts this script's folder first on sys.path, which would make pipeline's modules
# importable as top-level names (a user module called "transform" would resolve to ours).
# Replace it with the repository root, so "pipeline" is importable even when not installed.
if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    sys.path[0] = str(HERE.parent)

from pipeline.cli import main  # noqa: E402
from pipeline.logs import route_stderr_past_spark_submit  # noqa: E402
from pipeline.process_exit import end_hard_at_exit, exit_process  # noqa: E402
from pipeline.spark.session import submitted  # noqa: E402


def stop_when_orphaned(interval: float = 1.0) -> None:
    """spark-submit does not pass a SIGTERM on to its Python driver: when spark-submit
    dies (a scheduler stopped the task), the driver would run on alone, holding the
    pipeline's lock. Treat losing the parent as a SIGTERM: roll back and exit 143."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


if __name__ == "__main__":
    end_hard_at_exit()
    stop_when_orphaned()
    if submitted():
        # spark-submit merges our stderr into its stdout: logs and the error line would mix
        # with the --json document there. Write them to spark-submit's own stderr instead.
        route_stderr_past_spark_submit()
    exit_process(main())
