"""The gateway's configuration: the upstreams it fronts and how it queues for them."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

KINDS = ("vllm", "sglang", "llamacpp", "ferry", "openai")


def base_url(url: str) -> str:
    """`http://host:8000`, `http://host:8000/` and `http://host:8000/v1` -> `http://host:8000`."""
    url = url.strip().rstrip("/")
    url = url.removesuffix("/v1")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"an upstream URL must look like http://host:port, got {url!r}")
    return url


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    url: str  # the server's base (no /v1)
    api_key: str | None = None  # sent upstream as a Bearer token; never shown
    kind: str | None = None  # None: detected from the server's /metrics
    # requests Ferry lets it hold at once, the rest waiting in Ferry's queue; None: what the
    # upstream can run (Upstream.cap)
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", base_url(self.url))
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"upstream kind must be one of {', '.join(KINDS)}, "
                             f"got {self.kind!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ValueError("an upstream's max_in_flight must be >= 1")

    @property
    def name(self) -> str:
        """host:port, the upstream's name on the dashboard."""
        return urlsplit(self.url).netloc


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    upstreams: tuple[UpstreamConfig, ...]
    max_waiting: int = 256  # the global bound on Ferry's own queue (429 beyond it)
    admission: str = "fair"  # fair (round-robin across users) | fifo
    user_in_flight: int | None = None  # most requests one user may have upstream at once
    scrape_interval: float = 1.0  # seconds between looks at each upstream's metrics
    connect_timeout: float = 3.0
    stall_timeout: float = 60.0  # seconds without a byte from a streaming upstream: it is dead
    slow_after: float = 2.0  # a look (models, metrics) slower than this marks it slow
    down_wait: float = 15.0  # seconds a request waits for a down upstream before it fails
    retries: int = 2  # further tries (another upstream first) when one refuses before output
    retry_after: int = 5  # seconds, in 503s when no upstream is up
    default_context: int = 4096  # when an upstream does not say its max_model_len

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise ValueError("the gateway needs at least one upstream")
        if len({u.url for u in self.upstreams}) != len(self.upstreams):
            raise ValueError("the same upstream URL is listed twice")
        if self.admission not in ("fair", "fifo"):
            raise ValueError(f"unknown admission order {self.admission!r}")
        if self.max_waiting < 1 or (self.user_in_flight is not None and self.user_in_flight < 1):
            raise ValueError("max_waiting and user_in_flight must be >= 1")
