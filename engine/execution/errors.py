"""What loading a model can fail with: messages that `ferry serve` prints as they are."""
from __future__ import annotations


class ModelNotFound(FileNotFoundError):
    """No usable model at the given place (the message says how to get one)."""


class ModelFileError(ModelNotFound):
    """A model file exists but Ferry cannot run it: truncated, an unknown block type, an
    architecture outside the Llama family, shapes that disagree with its metadata. The message
    names the file and, where one is at fault, the tensor."""
