"""OpenAI's Responses API (/v1/responses), stateless, over the chat path: schemas (the
request body), translate (input items <-> chat messages, output items), stream (the event
sequence), routes."""
