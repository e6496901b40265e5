"""Text rules shared by the engine thread's runtime and the tokenizer: stop strings
(stops), thinking models' reasoning tags (reasoning) and the chat template a model without
one chats with (chat_template). Pure Python, no torch: engine.runtime and
engine.execution.text both import it, and it imports neither."""
