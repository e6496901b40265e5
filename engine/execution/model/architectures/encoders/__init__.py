"""Encoders for embeddings and reranking (BERT and its kin), run by
engine.execution.encoder rather than as a CausalLM."""
