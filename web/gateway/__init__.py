"""Upstream mode (docs/upstreams.md): Ferry's web layer in front of OpenAI-compatible servers.

Gateway offers the Engine facade the web layer uses (submit, cancel, snapshot) over one or
more upstreams; GatewayTokenizer stands in for the tokenizer (the upstreams apply the chat
template and count tokens).
"""
from web.gateway.config import KINDS, GatewayConfig, UpstreamConfig, base_url
from web.gateway.gateway import Gateway, UpstreamsDown
from web.gateway.prompt import GatewayTokenizer, UpstreamPrompt

__all__ = ["KINDS", "Gateway", "GatewayConfig", "GatewayTokenizer", "UpstreamConfig",
           "UpstreamPrompt", "UpstreamsDown", "base_url"]
