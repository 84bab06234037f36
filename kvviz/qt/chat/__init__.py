"""The "Chat" mode: a conversation with the cache kept across its turns (mode.py; chatter.py on the worker thread,
series.py, plots.py, view.py, help.py)."""
