"""What another user sees of a server, measured from a process of its own:
`python -m tests.tools.stall_probe URL TOKEN MODEL`.

Polls `/healthz` back to back (10 ms apart) and reads a chat stream token by token (400
tokens, EOS ignored, restarted when it ends). Prints `ready` once the stream writes, then,
when a line arrives on stdin (or it closes), one JSON line: `healthz` [[sent, answered]...],
`streams` [[token arrival...]...], `failures` [...]; times are time.monotonic(), which is
the same clock in every process of the machine. Its own process, so that the test's clients
(a megabyte page read by three threads) do not delay its measurements through their GIL.
"""
from __future__ import annotations

import json
import sys
import threading
import time

import httpx


class Probe:
    def __init__(self, url: str, token: str, model: str) -> None:
        self.url, self.token, self.model = url, token, model
        self.healthz: list[tuple[float, float]] = []
        self.streams: list[list[float]] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.poll, daemon=True),
                        threading.Thread(target=self.read, daemon=True)]

    def poll(self) -> None:
        with httpx.Client(base_url=self.url, timeout=300) as client:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    status = client.get("/healthz").status_code
                except httpx.HTTPError as exc:
                    self.failures.append(f"/healthz: {exc!r}")
                    return
                self.healthz.append((sent, time.monotonic()))
                if status != 200:
                    self.failures.append(f"/healthz answered {status}")
                    return
                time.sleep(0.01)

    def read(self) -> None:
        body = {"model": self.model, "max_tokens": 400, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": "Tell a long story."}]}
        headers = {"Authorization": f"Bearer {self.token}"}
        with httpx.Client(base_url=self.url, timeout=300, headers=headers) as client:
            while not self.stop.is_set():
                arrivals: list[float] = []
                self.streams.append(arrivals)
                try:
                    with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        for line in r.iter_lines():
                            if '"content":"' in line:
                                arrivals.append(time.monotonic())
                            if self.stop.is_set():
                                return
                except httpx.HTTPError as exc:
                    self.failures.append(f"stream: {exc!r}")
                    return

    def run(self) -> None:
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + 180
        while not (self.streams and len(self.streams[-1]) > 3) and not self.failures:
            if time.monotonic() > deadline:
                self.failures.append("the stream wrote nothing for 180 s")
                break
            time.sleep(0.02)
        print("ready", flush=True)
        sys.stdin.readline()
        self.stop.set()
        for t in self.threads:
            t.join(30)
        print(json.dumps({"healthz": self.healthz, "streams": self.streams,
                          "failures": self.failures}), flush=True)


if __name__ == "__main__":
    Probe(*sys.argv[1:4]).run()
