"""Scripts that drive the window from outside: the demo, the GUI and recording benches, screenshots and report
figures (drive.py opens a scratch window for them)."""
