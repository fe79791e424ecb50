"""spark-submit entry point: ``spark-submit --jars <connector jars> pipeline/submit.py run
--config conf/local.toml`` does the same run as ``pipeline run``."""

import sys

from pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
