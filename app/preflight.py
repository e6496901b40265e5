"""Checks `ferry serve` runs before loading anything heavy, so mistakes fail fast and clearly."""
from __future__ import annotations

import dataclasses
import errno
import socket
import sys
from pathlib import Path

from app.commands.users import users_exist
from app.models import ModelError, ModelRef, resolve_model
from app.paths import Paths
from app.settings import Settings
from web.access.users import UserError


class PreflightError(Exception):
    """serve cannot start; the message says why and what to do."""


def port_problem(host: str, port: int) -> str | None:
    """None when host:port can be bound now, else a sentence saying why not."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot use host {host!r}: {exc.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        if sys.platform != "win32":
            # like uvicorn: a port left in TIME_WAIT by a previous run counts as free
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE or getattr(exc, "winerror", None) == 10048:
                return (f"port {port} on {host} is already in use (another Ferry?); "
                        f"stop it or choose another with --port")
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"host {host} is not an address of this machine"
            if exc.errno == errno.EACCES:
                return f"no permission to listen on port {port}; choose a port above 1023"
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def served_models(settings: Settings) -> list[ModelRef]:
    """Every model to serve, resolved (the default first); raises ModelError."""
    refs = [resolve_model(spec) for spec in settings.served_models]
    if settings.mmproj:
        refs[0] = with_projector(refs[0], settings.mmproj)
    names = [r.name for r in refs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ModelError(f"two models would both be served as {', '.join(twice)}: name "
                         "each once")
    return refs


def with_projector(ref: ModelRef, mmproj: str) -> ModelRef:
    """`ref` with the projector file `mmproj` (a GGUF model's; checked to be one Ferry reads,
    its pairing with the model is checked when the model loads)."""
    from engine.execution.loading.projector_gguf import projector_type

    path = Path(mmproj).expanduser()
    if ref.kind not in ("gguf", "default") or ref.path is None or not ref.path.is_file():
        raise ModelError(f"mmproj {path} pairs with a .gguf model, not {ref.name}")
    if not path.is_file():
        raise ModelError(f"mmproj: no projector file at {path}")
    if not projector_type(path):
        raise ModelError(f"mmproj: {path} is not a projector file (a GGUF with architecture "
                         "'clip', as llama.cpp's convert_hf_to_gguf.py --mmproj writes it)")
    return dataclasses.replace(ref, projector=path.resolve())


def draft_model(settings: Settings) -> ModelRef:
    """speculative draft's model, resolved: a GGUF file or a model folder on this machine
    (or "default"); raises PreflightError."""
    try:
        ref = resolve_model(settings.draft_model)
    except ModelError as exc:
        raise PreflightError(f"draft model: {exc} (draft_model from "
                             f"{settings.source('draft_model')})") from None
    if ref.path is None:
        raise PreflightError(f"draft model {settings.draft_model!r}: a .gguf file or a model "
                             "folder on this machine is needed")
    return ref


def check_serve(settings: Settings, paths: Paths) -> ModelRef:
    """Raise PreflightError for the first problem; returns the resolved model."""
    try:
        have_users = not settings.shared or users_exist(paths)
    except UserError as exc:
        raise PreflightError(f"cannot check users for sharing: {exc}") from None
    if not have_users:
        raise PreflightError(
            f"refusing to listen on {settings.host}: sharing on the network requires users "
            f"with access tokens, and there are none in {paths.users_file}. "
            f"Create one with `ferry users add NAME --admin`, or serve on 127.0.0.1.")
    try:
        # upstream mode loads no model: the upstreams serve theirs
        model = ModelRef("upstream", "upstream", None) if settings.upstreams else \
            served_models(settings)[0]
    except ModelError as exc:
        key = "models" if settings.models else "model"
        raise PreflightError(f"{exc} (model from {settings.source(key)})") from None
    if settings.speculative == "draft" and not settings.upstreams:
        draft_model(settings)
    problem = port_problem(settings.host, settings.port)
    if problem:
        raise PreflightError(problem)
    return model
