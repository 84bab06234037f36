"""The command line: one module per command (`add_parser`, `command`), main.py to parse and dispatch."""
