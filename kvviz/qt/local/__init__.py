"""The "Local run" mode: mode.py, the runs' side of the worker (runs.py), the plots of its runs (view.py), help.py."""
