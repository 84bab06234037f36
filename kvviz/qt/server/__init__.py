"""The "vLLM server" mode: mode.py, its controls (panel.py), the connection, its series, plots and view, help.py."""
