"""The "Evaluate" mode: mode.py, its controls (panel.py), the worker-side evaluator, its series, plots and view,
help.py."""
