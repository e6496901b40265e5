"""The building blocks every architecture shares: norms, projections, embeddings,
activations, rotary embedding, attention, the gated MLP and the mixture-of-experts MLP."""
from engine.execution.model.layers.activation import (
    ACTIVATIONS,
    gelu_tanh_and_mul,
    silu_and_mul,
)
from engine.execution.model.layers.attention import Attention
from engine.execution.model.layers.embedding import Embedding
from engine.execution.model.layers.linear import Linear, PackedLinear
from engine.execution.model.layers.mlp import GatedMLP
from engine.execution.model.layers.moe import MoEMLP
from engine.execution.model.layers.norm import RMSNorm
from engine.execution.model.layers.rotary import RotaryEmbedding, rope_inv_freq, rotate_

__all__ = ["ACTIVATIONS", "Attention", "Embedding", "GatedMLP", "Linear", "MoEMLP", "PackedLinear",
           "RMSNorm", "RotaryEmbedding", "gelu_tanh_and_mul", "rope_inv_freq", "rotate_",
           "silu_and_mul"]
