"""The "Local run" mode: the local model's worker bridge (engine.py) and the plots of its runs (view.py)."""
