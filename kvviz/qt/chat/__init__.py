"""The "Conversation" mode: a chat with the cache kept across turns (chatter.py on the worker thread, mode.py,
view.py, plots.py)."""
