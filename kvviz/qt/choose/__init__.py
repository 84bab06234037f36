"""The "Choose" mode: mode.py, its controls (panel.py), the sweep on the worker thread (runner.py), the frontier,
curves and table (frontier_plot.py, curves.py, table.py, view.py), help.py."""
