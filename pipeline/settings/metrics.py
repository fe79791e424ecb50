"""[metrics]: where a run's Prometheus metrics go (pipeline/driver/metrics.py)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from pipeline.errors import ConfigError
from pipeline.settings.base import Table, expand_env


@dataclass(frozen=True)
class MetricsSettings:
    """Neither set = nowhere."""
    textfile: str | None = None  # for node_exporter's textfile collector (*.prom)
    pushgateway: str | None = None  # http(s)://host:port of a Pushgateway


class MetricsTable(Table):
    textfile: str | None = None
    pushgateway: str | None = None

    def value(self, env: dict[str, str]) -> MetricsSettings:
        if self.textfile is not None and not self.textfile.endswith(".prom"):
            raise ConfigError(f"'metrics.textfile' = {self.textfile!r}: node_exporter's "
                              "textfile collector reads only *.prom files; end the name in "
                              ".prom")
        gateway = self.pushgateway
        if gateway is not None:
            gateway = expand_env(gateway, "metrics.pushgateway", env)
            parts = urlsplit(gateway)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(f"'metrics.pushgateway' = {gateway!r}: write the "
                                  "Pushgateway's URL as http://host:9091")
        return MetricsSettings(self.textfile, gateway)
