"""Opt-in (`-m slow`, FERRY_LLAMA_CPP=<a llama.cpp source checkout>): vision models as people
get them for llama.cpp and LM Studio, a text GGUF with its projector file (`mmproj`) beside
it, both written by the checkout's own `convert_hf_to_gguf.py` (`--mmproj` for the
projector) from the seeded tiny Gemma 3, SmolVLM, Qwen2.5-VL and Mistral 3 the HF-folder
tests use, and
the tiny LLaVA and LLaVA-NeXT by llama.cpp's documented LLaVA 1.5 and 1.6 steps
(`llava_surgery_v2.py` takes the projector (and 1.6's newline) out,
`convert_image_encoder_to_gguf.py` writes it with the CLIP tower, F16, and for 1.6 the
pinpoints its CLIP config names).
Ferry pairs the projector by itself (the one `mmproj*.gguf` beside the model) and its
greedy replies and prompt counts through the API equal transformers' float32 for text + one
image and text + two images."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.execution.loading.test_llama_cpp_files import (  # noqa: F401 (fixtures)
    converter_python,
    llama_cpp,
)
from tests.tools import (
    tiny_gemma3,
    tiny_idefics3,
    tiny_llava,
    tiny_llava_next,
    tiny_mistral3,
    tiny_qwen2_5_vl,
)
from tests.tools.tiny_llava import ask, content, png

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
TEXT = "What is in the picture? Say it in a few words, please, and then some more."


def convert(python: Path, root: Path, folder: Path, out: Path, *extra: str) -> None:
    done = subprocess.run([str(python), str(root / "convert_hf_to_gguf.py"), str(folder),
                           "--outtype", "f32", "--outfile", str(out), *extra],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def hub_layout(file: Path) -> None:
    """transformers 5 saves the tower as `vision_tower.*`; Gemma 3's files (and llama.cpp's
    converter) have `vision_tower.vision_model.*`."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(file)
    save_file({("vision_tower.vision_model." + k[len("vision_tower."):]
                if k.startswith("vision_tower.") else k): v for k, v in tensors.items()},
              file, metadata={"format": "pt"})


TOOLS: dict[str, Any] = {"gemma3": tiny_gemma3, "smolvlm": tiny_idefics3,
                         "qwen2_5_vl": tiny_qwen2_5_vl, "llava": tiny_llava,
                         "llava_next": tiny_llava_next, "mistral3": tiny_mistral3,
                         "pixtral": tiny_mistral3}  # Pixtral 12B: build(..., pixtral=True)
LLAVAS = ("llava", "llava_next")  # converted by llama.cpp's legacy steps
# (width, height) of the test's images; Qwen2.5-VL's of two shapes, several windows each;
# LLaVA-NeXT's a wide one and a tall one, each its own grid of tiles; Mistral 3's a wide one
# scaled down and a tall one that fits, each its own rows of merged patches
SIZES = {"qwen2_5_vl": [(150, 100), (90, 200)], "llava_next": [(90, 20), (17, 70)],
         "mistral3": [(90, 20), (30, 50)], "pixtral": [(90, 20), (30, 50)]}


def renamed_keys(file: Path, renames: tuple[tuple[str, str], ...]) -> None:
    from safetensors.torch import load_file, save_file

    out = {}
    for k, v in load_file(file).items():
        for old, new in renames:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        out[k] = v
    save_file(out, file, metadata={"format": "pt"})


def qwen_hub_layout(file: Path) -> None:
    """transformers 5 saves Qwen2.5-VL as `model.language_model.*`, `model.visual.*`; its
    published files (and llama.cpp's converter) have `model.*` and `visual.*`."""
    renamed_keys(file, (("model.language_model.", "model."), ("model.visual.", "visual.")))


# transformers 5's LLaVA keys -> the published llava-hf files' (which llama.cpp's scripts read)
LLAVA_HUB = (("model.language_model.", "language_model.model."),
             ("lm_head.", "language_model.lm_head."),
             ("model.vision_tower.", "vision_tower."),
             ("model.multi_modal_projector.", "multi_modal_projector."))

# transformers 5's CLIPVisionModel keys -> the published CLIP files' (transformers 4 reads)
CLIP_HUB = tuple((k, "vision_model." + k) for k in ("embeddings.", "encoder.", "pre_layrnorm.",
                                                     "post_layernorm."))


def legacy_llava_projector(python: Path, root: Path, folder: Path, model: Any,
                           store: Path) -> None:
    """llama.cpp's LLaVA 1.5 and 1.6 steps: llava_surgery_v2.py saves the projector's tensors
    (and 1.6's newline) as `llava.projector`; convert_image_encoder_to_gguf.py writes them
    with the CLIP tower (its last layer dropped) as mmproj-model-f16.gguf in `store`, with the
    checkout's gguf-py (as its requirements file installs it). For 1.6 the CLIP folder's
    config names the pinpoints (width then height, as llama.cpp's documented config_vit.json
    for LLaVA 1.6 does), the crop and the merge type."""
    legacy = root / "tools" / "mtmd" / "legacy-models"
    done = subprocess.run([str(python), str(legacy / "llava_surgery_v2.py"), "-m", str(folder)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and (folder / "llava.projector").exists(), done.stdout[-3000:]
    clip = folder.parent / f"{folder.name}-clip"
    model.model.vision_tower.save_pretrained(clip)
    renamed_keys(clip / "model.safetensors", CLIP_HUB)
    grid = getattr(model.config, "image_grid_pinpoints", None)
    if grid is not None:
        file = clip / "config.json"
        cfg = json.loads(file.read_text())
        cfg.update(image_grid_pinpoints=[[w, h] for h, w in grid],
                   image_crop_resolution=cfg["image_size"], mm_patch_merge_type="spatial_unpad")
        file.write_text(json.dumps(cfg))
    done = subprocess.run([str(python), str(legacy / "convert_image_encoder_to_gguf.py"),
                           "-m", str(clip), "--clip-model-is-vision",
                           "--llava-projector", str(folder / "llava.projector"),
                           "--output-dir", str(store)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root / "gguf-py")})
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module",
                params=["gemma3", "smolvlm", "qwen2_5_vl", "llava", "llava_next", "mistral3",
                        "pixtral"])
def converted(request: pytest.FixtureRequest, tokenizer: Any, llama_cpp: Path,  # noqa: F811
              converter_python: Path,  # noqa: F811
              tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any, Path]:
    """(family, HF folder, transformers' model, the GGUF with its mmproj beside it)."""
    tool = TOOLS[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    options = {"qwen2_5_vl": {"window": 112}, "pixtral": {"pixtral": True}}
    model = tool.build(folder, tokenizer, **options.get(request.param, {}))
    if request.param in LLAVAS:  # its image side as the legacy script stores it: float16
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "language_model." not in name and "lm_head" not in name and p.dim() in (2, 4):
                    p.copy_(p.half().float())
    # the converter's transformers 4 knows neither transformers 5's tokenizer class name nor
    # its list of extra special tokens (a dict of named ones there)
    convertible = tmp_path_factory.mktemp(f"{request.param}-convertible")
    shutil.copytree(folder, convertible, dirs_exist_ok=True)
    config = convertible / "tokenizer_config.json"
    fields = {**json.loads(config.read_text()), "tokenizer_class": "GPT2Tokenizer"}
    extra = fields.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        fields["additional_special_tokens"] = extra
    config.write_text(json.dumps(fields))
    if request.param == "gemma3":  # the tower's keys as Gemma 3's published files hold them
        hub_layout(convertible / "model.safetensors")
    elif request.param == "qwen2_5_vl":
        qwen_hub_layout(convertible / "model.safetensors")
    elif request.param in (*LLAVAS, "mistral3", "pixtral"):  # Mistral's files are so too
        renamed_keys(convertible / "model.safetensors", LLAVA_HUB)
        if request.param == "llava_next":  # the converter reads its text model as 1.5's
            file = convertible / "config.json"
            cfg = json.loads(file.read_text())
            cfg["architectures"] = ["LlavaForConditionalGeneration"]
            file.write_text(json.dumps(cfg))
    else:  # SmolVLM's config names its text model's class, which the converter goes by
        file = convertible / "config.json"
        cfg = json.loads(file.read_text())
        cfg["text_config"]["architectures"] = ["VLlama3ForCausalLM"]
        file.write_text(json.dumps(cfg))
    store = tmp_path_factory.mktemp(f"{request.param}-lmstudio")  # LM Studio's layout
    gguf = store / f"tiny-{request.param}-F32.gguf"
    convert(converter_python, llama_cpp, convertible, gguf)
    if request.param in LLAVAS:
        legacy_llava_projector(converter_python, llama_cpp, convertible, model, store)
    else:
        convert(converter_python, llama_cpp, convertible,
                store / f"mmproj-tiny-{request.param}-F32.gguf", "--mmproj")
    return request.param, folder, model, gguf


def test_gguf_with_its_projector_equals_transformers(
        converted: tuple[str, Path, Any, Path], make_server: Any) -> None:
    from engine import EngineConfig, ModelExecutor, Tokenizer

    family, folder, model, gguf = converted
    config = EngineConfig(page_size=4, kv_tokens=4096, max_context=1024, kv_dtype="float32")
    executor = ModelExecutor.from_pretrained(gguf, config, dtype=torch.float32, threads=1)
    assert executor.vision is not None
    projector = "mmproj-model-f16.gguf" if family in LLAVAS \
        else f"mmproj-tiny-{family}-F32.gguf"
    assert executor.describe().endswith(f", text + images (projector {projector})")
    server = make_server(web={"model_name": f"tiny-{family}", "max_images": 2},
                         executor=executor, tokenizer_override=Tokenizer(gguf),
                         page_size=4, kv_tokens=4096, max_context=1024, kv_dtype="float32")
    tool = TOOLS[family]
    sizes = SIZES.get(family, [(50, 40), (30, 90)])
    for count in (1, 2):
        images = [png(seed, size) for seed, size in enumerate(sizes)][:count]
        r = ask(server, content(TEXT, images))
        assert r.status_code == 200, r.text
        want = tool.reference(folder, model, TEXT, images, 6)
        body = r.json()
        assert body["usage"]["prompt_tokens"] == want[0]
        assert body["choices"][0]["message"]["content"] == want[1]
    assert server.engine.wait_idle(30)
