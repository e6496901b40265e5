"""Vision-language models: a vision tower and projector (model/vision) over a text
architecture of ../text, one file per family."""
