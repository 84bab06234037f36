"""Record the window to MP4 (imageio-ffmpeg, H.264) or, without it, an animated GIF (Pillow).

A QTimer grabs the window on the GUI thread at a steady rate (10 fps by default). Each grab is
converted QImage -> numpy without copies beyond one, padded or cropped to the first frame's size
(even, for H.264), and piped to ffmpeg; when a tick comes late the previous frame is repeated so
the video's clock matches the wall clock. The elapsed time shows in the status bar while recording.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QImage, QKeySequence
from PySide6.QtWidgets import QFileDialog, QLabel, QMainWindow, QWidget

GIF_MAX_WIDTH = 960  # GIF frames are kept in memory: halve big windows


def have_ffmpeg() -> bool:
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except Exception:  # noqa: BLE001 - any failure means: no MP4
        return False
    return True


def qimage_to_array(image: QImage) -> np.ndarray:
    """An RGB uint8 array (height, width, 3) of a QImage."""
    image = image.convertToFormat(QImage.Format.Format_RGB888)
    height, width, stride = image.height(), image.width(), image.bytesPerLine()
    buffer = np.frombuffer(image.constBits(), dtype=np.uint8, count=stride * height).reshape(height, stride)
    return buffer[:, : width * 3].reshape(height, width, 3).copy()


def fit(frame: np.ndarray, height: int, width: int) -> np.ndarray:
    """Crop or pad (black) frame to height x width."""
    if frame.shape[0] == height and frame.shape[1] == width:
        return frame
    out = np.zeros((height, width, 3), dtype=np.uint8)
    h, w = min(height, frame.shape[0]), min(width, frame.shape[1])
    out[:h, :w] = frame[:h, :w]
    return out


class _Mp4Writer:
    def __init__(self, path: Path, size: tuple[int, int], fps: float):
        import imageio_ffmpeg

        self._gen = imageio_ffmpeg.write_frames(
            str(path), size, fps=fps, codec="libx264", pix_fmt_in="rgb24", pix_fmt_out="yuv420p",
            macro_block_size=2, quality=None, output_params=["-preset", "ultrafast", "-crf", "23"],
        )
        self._gen.send(None)

    def write(self, frame: np.ndarray) -> None:
        self._gen.send(np.ascontiguousarray(frame))

    def close(self) -> None:
        self._gen.close()


class _GifWriter:
    def __init__(self, path: Path, size: tuple[int, int], fps: float):
        self.path, self.fps, self.frames = path, fps, []
        width, height = size
        self.scale = 1 if width <= GIF_MAX_WIDTH else 2

    def write(self, frame: np.ndarray) -> None:
        from PIL import Image

        if self.scale > 1:
            frame = frame[:: self.scale, :: self.scale]
        self.frames.append(Image.fromarray(frame).quantize(colors=255, method=Image.Quantize.FASTOCTREE))

    def close(self) -> None:
        if self.frames:
            duration = int(round(1000.0 / self.fps))
            self.frames[0].save(self.path, save_all=True, append_images=self.frames[1:], duration=duration, loop=0)
        self.frames = []


class Recorder(QObject):
    """Grabs `target` at `fps` into `path` (.mp4 with ffmpeg, else .gif); start() then stop()."""

    sigStarted = Signal(str)
    sigStopped = Signal(str, int)  # path, frames written

    def __init__(self, target: QWidget, parent: QObject | None = None):
        super().__init__(parent if parent is not None else target)
        self.target = target
        self.timer = QTimer(self)
        self.timer.setTimerType(Qt.TimerType.PreciseTimer)
        self.timer.timeout.connect(self.capture)
        self.path: Path | None = None
        self.fps = 10.0
        self.frames = 0  # written to the file (including repeats)
        self.grabs = 0  # real grabs of the window
        self.grab_ms = 0.0  # total time spent grabbing and writing
        self.size: tuple[int, int] | None = None
        self.started = 0.0
        self.stopped = 0.0
        self._writer = None
        self._last: np.ndarray | None = None

    @property
    def recording(self) -> bool:
        return self._writer is not None

    def elapsed(self) -> float:
        return (time.perf_counter() if self.recording else self.stopped) - self.started

    def start(self, path: str | os.PathLike, fps: float = 10.0) -> Path:
        if self.recording:
            self.stop()
        path = Path(path)
        if path.suffix.lower() == ".mp4" and not have_ffmpeg():
            path = path.with_suffix(".gif")
        self.path, self.fps = path, float(fps)
        first = qimage_to_array(self.target.grab().toImage())
        height, width = first.shape[0] // 2 * 2, first.shape[1] // 2 * 2
        self.size = (width, height)
        writer_type = _GifWriter if path.suffix.lower() == ".gif" else _Mp4Writer
        self._writer = writer_type(path, self.size, self.fps)
        self.frames = self.grabs = 0
        self.grab_ms = 0.0
        self.started = time.perf_counter()
        self._emit(fit(first, height, width))
        self.grabs = 1
        self.timer.start(int(round(1000.0 / self.fps)))
        self.sigStarted.emit(str(path))
        return path

    def capture(self) -> None:
        if not self.recording:
            return
        t0 = time.perf_counter()
        due = int((t0 - self.started) * self.fps) + 1  # frames the clock says should exist by now
        if due <= self.frames:
            return
        width, height = self.size
        frame = fit(qimage_to_array(self.target.grab().toImage()), height, width)
        self.grabs += 1
        while self.frames < due - 1 and self._last is not None:  # a late tick: hold the last picture
            self._emit(self._last)
        self._emit(frame)
        self.grab_ms += (time.perf_counter() - t0) * 1000.0

    def _emit(self, frame: np.ndarray) -> None:
        self._writer.write(frame)
        self._last = frame
        self.frames += 1

    def stop(self) -> Path | None:
        if not self.recording:
            return None
        self.timer.stop()
        self.capture()
        self.stopped = time.perf_counter()
        writer, self._writer, self._last = self._writer, None, None
        writer.close()
        self.sigStopped.emit(str(self.path), self.frames)
        return self.path

    def stats(self) -> dict:
        seconds = max(self.elapsed(), 1e-9)
        return {
            "path": str(self.path) if self.path else None,
            "seconds": seconds,
            "frames": self.frames,
            "grabs": self.grabs,
            "grab_fps": self.grabs / seconds,
            "mean_grab_ms": self.grab_ms / max(1, self.grabs - 1),
            "size": self.size,
            "bytes": self.path.stat().st_size if self.path and self.path.exists() and not self.recording else None,
        }


class RecordControl(QObject):
    """The Record menu (Ctrl+R toggles) and the status-bar clock; kept on the window as `window.recorder`."""

    def __init__(self, window: QMainWindow, fps: float = 10.0):
        super().__init__(window)
        self.window = window
        self.fps = fps
        self.recorder = Recorder(window, self)
        self.label = QLabel()
        self.label.setObjectName("recordingLabel")
        self.label.setStyleSheet("color: #e0443e; font-weight: bold;")
        self.label.hide()
        window.statusBar().addPermanentWidget(self.label)
        self.clock = QTimer(self)
        self.clock.setInterval(250)
        self.clock.timeout.connect(self._tick)
        menu = window.menuBar().addMenu("Re&cord")
        self.action = QAction("&Record window…", window, checkable=True)
        self.action.setShortcut(QKeySequence("Ctrl+R"))
        self.action.setToolTip("Record the window to MP4 (or GIF without ffmpeg); again to stop")
        self.action.triggered.connect(self._toggled)
        menu.addAction(self.action)
        window.addAction(self.action)

    def start(self, path: str | os.PathLike, fps: float | None = None) -> Path:
        path = self.recorder.start(path, fps or self.fps)
        self.action.setChecked(True)
        self.label.show()
        self._tick()
        self.clock.start()
        return path

    def stop(self) -> Path | None:
        path = self.recorder.stop()
        self.clock.stop()
        self.action.setChecked(False)
        if path is not None:
            self.label.hide()  # the red clock is for recording; the save is confirmed as a note
            self.window.say_saved(path, f"{self.recorder.frames} frames")
        return path

    def _tick(self) -> None:
        seconds = int(self.recorder.elapsed())
        self.label.setText(f"● REC {seconds // 60:02d}:{seconds % 60:02d}")

    def _toggled(self, checked: bool) -> None:
        if not checked:
            self.stop()
            return
        suffix = "mp4" if have_ffmpeg() else "gif"
        path, _ = QFileDialog.getSaveFileName(self.window, "Record window to", f"kvviz.{suffix}",
                                              "Video (*.mp4 *.gif)")
        if path:
            self.start(path)
        else:
            self.action.setChecked(False)


def install_recorder(window: QMainWindow, fps: float = 10.0) -> RecordControl:
    control = RecordControl(window, fps)
    window.recorder = control
    return control
