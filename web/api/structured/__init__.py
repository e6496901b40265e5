"""Structured output and tool calling on the OpenAI-compatible API.

fields (response_format and the vLLM / llama.cpp names -> a Constraint), tools (tools and
tool_choice -> a plan, template input, a forced call's grammar), formats (each template's
tool-call format), parse (reading calls out of replies), shape (choices and chunks with tool
calls), chat_input (a chat request's prompt and constraint, local or upstream).
"""
