"""The "vLLM server" mode: its controls (panel), the connection, its series, plots and view."""
