"""Images in chat requests (vision models): OpenAI `image_url` content parts checked,
decoded and preprocessed off the event loop, and placed in the prompt. The API and the chat
page share `prompt_with_images` (or `build_image_prompt`, its blocking form, for a caller
already on a worker thread)."""
from web.api.vision.fetch import may_fetch
from web.api.vision.images import (
    ImagePrompt,
    build_image_prompt,
    image_parts,
    prompt_with_images,
    vision_of,
)

__all__ = ["ImagePrompt", "build_image_prompt", "image_parts", "may_fetch",
           "prompt_with_images", "vision_of"]
