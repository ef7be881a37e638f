"""Reading a Prometheus exposition (a gateway's /metrics) in tests, with prometheus_client's own
text parser: one `Scrape` whichever way the text was fetched."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.obs.metrics import Metrics

Labels = tuple[tuple[str, str], ...]  # a sample's labels, sorted by name


@dataclass(frozen=True)
class Scrape:
    families: tuple[Metric, ...]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        return cls(tuple(text_string_to_metric_families(text)))

    @classmethod
    def of(cls, metrics: Metrics) -> Scrape:
        """What a scrape of `metrics` (an in-process app's or pipeline's) would read now."""
        return cls.parse(metrics.exposition().decode())

    def samples(self) -> dict[tuple[str, Labels], float]:
        """Every sample by its name and labels."""
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in self.families
            for s in family.samples
        }

    def series(self, name: str) -> dict[Labels, float]:
        """The samples named `name`, by their labels."""
        return {labels: v for (sample, labels), v in self.samples().items() if sample == name}

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples named `name` whose labels include `labels` (0 when none)."""
        wanted = set(labels.items())
        return sum(v for series, v in self.series(name).items() if wanted <= set(series))

    def get(self, name: str, **labels: str) -> float | None:
        """The sample named `name` with exactly `labels`, None while there is none."""
        return self.series(name).get(tuple(sorted(labels.items())))
