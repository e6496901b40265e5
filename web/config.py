"""The web layer's configuration, built by `app` from settings."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# the users and their access tokens, in data_dir; app.paths (the `users` command) names the same
USERS_FILE = "users.json"


@dataclass(frozen=True, slots=True)
class WebConfig:
    data_dir: Path  # SQLite database and users file live here
    model_name: str = "SmolLM2-135M-Instruct"
    # how the model runs, in one line ("llama: GGUF Q4_1 + Q8_0 head, native AVX2 kernels,
    # 97 MB"): architecture, block types, kernels; "" where no model is loaded here
    model_runs: str = ""
    shared: bool = False  # listening beyond loopback: tokens required everywhere
    per_user_limit: int = 8  # waiting + running requests per user (shared mode)
    max_body_bytes: int = 1024 * 1024
    max_messages: int = 200
    max_images: int = 8  # images in one request (vision models)
    max_image_pixels: int = 25_000_000  # width x height of one image
    # remote http(s) image URLs: fetched only when on (in shared mode, for admins only),
    # each within these bytes and seconds
    fetch_image_urls: bool = False
    image_fetch_bytes: int = 20 * 1024 * 1024
    image_fetch_seconds: float = 10.0
    max_stop: int = 4
    max_tokens_limit: int = 4096
    default_max_tokens: int = 512
    dashboard_interval: float = 0.4  # seconds between dashboard pushes while busy
    secret_key: bytes | None = None  # session-cookie signing key; made and kept in data_dir
    # chat page sampling (the API takes these per request)
    chat_temperature: float = 0.7
    chat_top_p: float = 0.95
    chat_ignore_eos: bool = False  # keep writing past EOS up to default_max_tokens (demos, tests)
    chat_system_prompt: str | None = None  # None: the chat template's own default
    # pictures attached in the chat: the largest one file, and all of one conversation's
    chat_image_bytes: int = 10 * 1024 * 1024
    chat_conversation_image_bytes: int = 50 * 1024 * 1024
    save_interval: float = 0.5  # seconds between saves of a streaming reply
    assets_dir: Path | None = None  # node_modules with htmx.org and htmx-ext-sse (None: repo's)
    # names served besides loopback and the bound address (web.access.hosts): `name` (any
    # port), `name:port`, `.domain` (and its subdomains); for a reverse proxy or a DNS name
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # frozen: normalise the paths through object.__setattr__
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.assets_dir is not None:
            object.__setattr__(self, "assets_dir", Path(self.assets_dir))
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        for name in ("per_user_limit", "max_body_bytes", "max_messages", "max_tokens_limit",
                     "default_max_tokens", "chat_image_bytes",
                     "chat_conversation_image_bytes", "max_image_pixels",
                     "image_fetch_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.max_stop < 0 or self.max_images < 0:
            raise ValueError("max_stop and max_images must be >= 0")
        if not self.image_fetch_seconds > 0:
            raise ValueError("image_fetch_seconds must be > 0")
        if self.save_interval < 0 or self.dashboard_interval <= 0:
            raise ValueError("save_interval must be >= 0, dashboard_interval > 0")

    @property
    def chat_body_bytes(self) -> int:
        """The largest body a chat form may send: a message with pictures, or an exported
        conversation (its pictures in base64) to import. Each message and picture is still
        checked by its own limit."""
        return self.max_body_bytes + self.chat_conversation_image_bytes * 4 // 3 + 64 * 1024

    @property
    def db_path(self) -> Path:
        return self.data_dir / "ferry.sqlite3"

    @property
    def users_path(self) -> Path:
        return self.data_dir / USERS_FILE
