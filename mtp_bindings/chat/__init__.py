"""Chats: rendering messages into a prompt and parsing the reply.

:mod:`.template` renders a chat with the model's Jinja template (:mod:`.template_env`, the
package's Gemma 4 template in :mod:`.gemma4_template`) or one of llama.cpp's built-in formats
(:mod:`.builtin_templates`); :mod:`.reply` splits a reply into content, thinking and tool calls.
Importing this package loads nothing.
"""
