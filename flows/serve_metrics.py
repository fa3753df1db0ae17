"""``strata serve``'s ``/metrics``: Prometheus text format (prometheus-client), one registry per app; with
``serve.workers > 1`` every worker process writes its values under ``PROMETHEUS_MULTIPROC_DIR`` (set by the CLI) and
a scrape, whichever worker answers it, sums them (gauges: the live processes' sum; the snapshot: their largest).

strata_requests_total{route,method,status,mode}   requests answered (mode: the query's retrieval mode)
strata_request_duration_seconds{route}             latency, from the first byte read to the response
strata_queries_in_flight / strata_queries_queued   queries running now / waiting for a slot
strata_queries_rejected_total{reason}              503s: queue_full, deadline, loading, snapshot_gone
strata_snapshot_version                            the snapshot the latest requests were answered from
strata_view_load_seconds                           loading a snapshot's view (once per version)
strata_connections_closed_total{reason}            connections closed: over_limit, header_timeout, head_too_large
"""

from __future__ import annotations

import os

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0, 60.0)
REJECT_REASONS = ("queue_full", "deadline", "loading", "snapshot_gone")


class Metrics:
    """The service's metrics; ``routes``: the paths that get their own label, ``prefixes``: those of routes that
    name an id (labelled ``<prefix>/{id}``); any other path counts as "other", so a scan of random URLs cannot grow
    the label set."""

    def __init__(self, routes: set[str], prefixes: tuple[str, ...] = ()):
        self.routes, self.prefixes = routes, prefixes
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "strata_requests",
            "Requests answered, by route, method, status and mode",
            ["route", "method", "status", "mode"],
            registry=r,
        )
        self.latency = Histogram(
            "strata_request_duration_seconds", "Request latency", ["route"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.in_flight = Gauge(
            "strata_queries_in_flight", "Queries running now", registry=r, multiprocess_mode="livesum"
        )
        self.queued = Gauge(
            "strata_queries_queued", "Queries waiting for a running slot", registry=r, multiprocess_mode="livesum"
        )
        self.rejected = Counter("strata_queries_rejected", "Queries answered 503, by reason", ["reason"], registry=r)
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)  # present at 0 before the first one
        self.snapshot = Gauge(
            "strata_snapshot_version", "Snapshot version of the latest answer", registry=r, multiprocess_mode="livemax"
        )
        self.connections_closed = Counter(
            "strata_connections_closed", "Connections closed before a request, by reason", ["reason"], registry=r
        )
        for reason in ("over_limit", "header_timeout", "head_too_large"):
            self.connections_closed.labels(reason)
        self.view_load = Histogram(
            "strata_view_load_seconds", "Loading a snapshot's view", buckets=LATENCY_BUCKETS, registry=r
        )

    def route(self, path: str) -> str:
        if path in self.routes:
            return path
        prefix = next((p for p in (*self.prefixes, "/static/", "/vendor/") if path.startswith(p)), None)
        return prefix.rstrip("/") + ("/{id}" if prefix in self.prefixes else "") if prefix else "other"

    def observe(self, path: str, method: str, status: int, mode: str | None, seconds: float) -> None:
        route = self.route(path)
        self.requests.labels(route, method, str(status), mode or "").inc()
        self.latency.labels(route).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        registry = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):  # several worker processes: what they all wrote
            from prometheus_client import multiprocess

            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
