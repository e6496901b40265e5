"""Vision layers the image families share: the ViT towers, the projectors, their configs."""
from engine.execution.model.vision.clip import ClipVisionTower
from engine.execution.model.vision.config import (
    QwenViTConfig,
    TowerConfig,
    VisionConfig,
    renamed,
    with_vision,
)
from engine.execution.model.vision.pixel_shuffle import PixelShuffleConnector
from engine.execution.model.vision.pooled import PooledProjector
from engine.execution.model.vision.projector import MLPProjector
from engine.execution.model.vision.qwen_vit import QwenVisionTower
from engine.execution.model.vision.siglip import SiglipVisionTower

__all__ = ["ClipVisionTower", "MLPProjector", "PixelShuffleConnector", "PooledProjector",
           "QwenViTConfig", "QwenVisionTower", "SiglipVisionTower",
           "TowerConfig", "VisionConfig", "renamed", "with_vision"]
