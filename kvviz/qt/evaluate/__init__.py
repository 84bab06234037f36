"""The "Evaluate" mode: its controls (panel), the worker-side evaluator, its series, plots and view."""
