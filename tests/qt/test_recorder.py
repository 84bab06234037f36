"""Recording the window while a run happens: read the frames back and check they show it changing."""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest

from kvviz.qt.recorder import have_ffmpeg, qimage_to_array


def _record(window, drive, qtbot, path, tokens=48):
    from PySide6.QtWidgets import QLabel

    control = window.recorder
    drive.load(window, "tiny")
    title = window.windowTitle()
    written = control.start(path, fps=10)
    assert control.recorder.recording and window.windowTitle().startswith("● REC")
    assert "slower while recording" in window.windowTitle()  # the encoder shares the CPU with the generation
    # the REC clock is in the title bar, outside the frames: nothing drawn in the window says it
    assert not [label for label in window.findChildren(QLabel) if label.isVisible() and "REC" in label.text()]
    qtbot.wait(400)
    drive.run(window, "dynamic", tokens=tokens)
    qtbot.wait(600)
    control.stop()
    assert not control.recorder.recording and window.windowTitle() == title
    assert str(written.resolve()) in window.statusBar().currentMessage()
    return written, control.recorder.stats()


def test_ffmpeg_is_installed():
    """imageio-ffmpeg is a dependency of kvviz: without it recording falls back to GIF, so its absence is a
    broken install, not a reason to skip the MP4 tests."""
    assert have_ffmpeg()


@pytest.mark.parametrize("suffix", ["mp4", "gif"])
def test_record_window_during_run(window, drive, qtbot, tmp_path, suffix):
    if suffix == "gif":
        window.resize(900, 600)
        qtbot.wait(50)
    path, stats = _record(window, drive, qtbot, tmp_path / f"clip.{suffix}")
    assert path.suffix == f".{suffix}" and path.stat().st_size > 1000
    frames = [np.asarray(f) for f in iio.imiter(path)]
    seconds = stats["seconds"]
    if suffix == "mp4":
        assert len(frames) >= 8
        # steady clock: frames written match wall time at 10 fps (late ticks repeat the last picture)
        assert abs(len(frames) - seconds * 10) <= 3, (len(frames), seconds)
    else:  # Pillow merges identical consecutive frames into one longer frame: check the clip's length
        from PIL import Image

        with Image.open(path) as gif:
            durations = []
            for index in range(gif.n_frames):
                gif.seek(index)
                durations.append(gif.info["duration"])
        assert len(frames) >= 4
        assert abs(sum(durations) / 1000.0 - seconds) <= 0.4, (sum(durations), seconds)
    grab = qimage_to_array(window.grab().toImage())
    height, width = frames[0].shape[:2]
    if suffix == "mp4":
        assert (width, height) == (grab.shape[1] // 2 * 2, grab.shape[0] // 2 * 2)
    else:
        assert (width, height) == (grab.shape[1], grab.shape[0]) or (width, height) == stats["size"]
    # frames differ over time
    first, last = frames[0][..., :3].astype(int), frames[-1][..., :3].astype(int)
    assert np.abs(first - last).mean() > 0.5
    distinct = {hash(f[..., :3].tobytes()) for f in frames}
    assert len(distinct) >= 3
    # and they show the window: the last frame is close to a grab of the window now
    now = grab[:height, :width].astype(int)
    assert np.abs(last - now).mean() < 12, np.abs(last - now).mean()


def test_recorded_demo(qapp, tmp_path):
    from kvviz.qt.tools.demo import SIZE, run_demo

    path = tmp_path / "demo.mp4"
    assert run_demo(path, model="tiny", tokens=16, pause=0.3) == 0
    frames = [np.asarray(f) for f in iio.imiter(path)]
    assert len(frames) >= 20
    height, width = frames[0].shape[:2]
    assert (width, height) == SIZE
    means = [f.mean() for f in frames]
    assert max(means) - min(means) > 0.5 or np.abs(frames[0].astype(int) - frames[-1].astype(int)).mean() > 1
    assert len({hash(f.tobytes()) for f in frames[:: max(1, len(frames) // 10)]}) >= 5


def test_sigterm_during_a_recorded_demo_keeps_a_complete_recording(tmp_path):
    """Wherever SIGTERM lands (a script's wait, a Qt override such as the wheel guard's event filter), the demo
    stops there, its recording is finished and readable, and the process exits 143 without a traceback."""
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "demo.mp4"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvviz", "demo", "--model", "tiny", "--tokens", "200", "--record", str(path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", XDG_CONFIG_HOME=str(tmp_path)),
    )
    deadline = time.monotonic() + 120
    while not (path.exists() and path.stat().st_size > 0) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)  # the recording has begun writing frames
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr and "Error calling Python override" not in stderr
    assert "kvviz demo: recorded" in stderr
    assert len(list(iio.imiter(path))) >= 5  # a finished file: ffmpeg wrote its index
