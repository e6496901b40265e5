"""Remote image URLs, fetched when a setting allows: `fetch_image_urls` on, and in shared mode
only for admins (a normal user's URL could make the server reach what only it can reach).
Each fetch is bounded in bytes and time, and runs on the worker thread that decodes the
image, never on the event loop."""
from __future__ import annotations

import time

from web.access.identity import User
from web.api.errors import APIError
from web.config import WebConfig

MAX_REDIRECTS = 3


def may_fetch(config: WebConfig, user: User) -> bool:
    """Whether `user`'s remote image URLs are fetched."""
    return config.fetch_image_urls and (not config.shared or user.is_admin)


def refusal(where: str) -> APIError:
    return APIError("remote image URLs are not fetched by this server for you (fetching is "
                    "off: fetch_image_urls, and in shared mode for admins only); send the "
                    "image inline as a data: URL (data:image/png;base64,...)",
                    param=f"{where}.image_url.url", code="image_fetch_disabled")


def fetch_image(url: str, where: str, config: WebConfig) -> bytes:
    """The bytes at `url` (http or https, at most MAX_REDIRECTS redirects), at most
    `image_fetch_bytes` of them within `image_fetch_seconds`; a 400 (`image_fetch_failed`)
    saying why otherwise. Blocks: call it off the event loop."""
    import httpx  # here: serving without remote images never loads it (nor rich, through it)

    limit, seconds = config.image_fetch_bytes, config.image_fetch_seconds
    deadline = time.monotonic() + seconds

    def failed(why: str) -> APIError:
        return APIError(f"the image at {where}.image_url.url could not be fetched: {why}",
                        param=f"{where}.image_url.url", code="image_fetch_failed")

    try:
        with httpx.Client(timeout=seconds, follow_redirects=True,
                          max_redirects=MAX_REDIRECTS) as client, \
                client.stream("GET", url, headers={"accept": "image/*"}) as reply:
            if reply.status_code != 200:
                raise failed(f"the server answered {reply.status_code}")
            declared = reply.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise failed(f"it is {int(declared)} bytes, above the limit of {limit}")
            data = bytearray()
            for chunk in reply.iter_bytes():
                data += chunk
                if len(data) > limit:
                    raise failed(f"it is above the limit of {limit} bytes")
                if time.monotonic() > deadline:
                    raise failed(f"it took longer than {seconds:g} s")
            return bytes(data)
    except httpx.TooManyRedirects:
        raise failed(f"more than {MAX_REDIRECTS} redirects") from None
    except httpx.TimeoutException:
        raise failed(f"it took longer than {seconds:g} s") from None
    except (httpx.HTTPError, ValueError) as exc:  # refused, unreachable, a bad URL
        raise failed(type(exc).__name__ if not str(exc) else str(exc)) from None
