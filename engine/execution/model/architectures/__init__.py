"""One file per architecture over the shared layers, by kind: text (decoders), vision
(vision-language families over a text one) and encoders (embeddings, reranking);
registry.py lists them."""
