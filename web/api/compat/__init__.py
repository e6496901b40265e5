"""The other APIs clients speak, as thin views over the chat path of /v1/chat/completions.

Each subpackage (anthropic: /v1/messages, responses: /v1/responses, ollama: /api/*) turns its
request into a ChatCompletionRequest, runs it through run.py (the same model routing,
template, tools, structured output, submission, cancel and shared-mode limits as the OpenAI
route), and renders the chat choices and stream deltas in its own shape.
"""
