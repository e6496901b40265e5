"""Choosing tokens: the sampler, grammar masks for constrained requests, draft verification."""
