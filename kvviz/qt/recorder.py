"""Record the window to MP4 (ffmpeg from imageio-ffmpeg, H.264) or, without it, an animated GIF (Pillow).

Recording must not change what it records: kvviz's timings. So the GUI thread only copies what is
on screen (QScreen.grabWindow: the window's last painted pixels, about 2 ms for 1080p here, where
QWidget.grab() paints every plot again, about 27 ms), on a timer at a steady rate (10 fps by default).
A writer thread hands the frames to the encoder, and ffmpeg runs at a lower CPU priority than kvviz,
so that it encodes in the time the generation leaves. When the writer falls behind, the capture
waits instead of queueing more, and the picture before stands for the frames missed, so the video's
clock still matches the wall clock.
`kvviz.qt.tools.record_bench` measures what recording costs the generation's tokens/s.

Nothing that says "recording" is drawn inside the window (it would be in every frame): the window's
title shows the REC clock and that timings run a little slow meanwhile, the Record menu's entry says how
to stop, and the saved file's full path is confirmed in the status bar.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
from PySide6.QtCore import QObject, QRect, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QImage, QKeySequence
from PySide6.QtWidgets import QMainWindow, QWidget

from kvviz.qt.file_dialogs import FileDialogs

GIF_MAX_WIDTH = 960  # GIF frames are kept in memory: halve big windows
QUEUE_FRAMES = 3  # frames waiting for the encoder at most; beyond that the capture repeats the last one
ENCODER_NICENESS = 10  # ffmpeg's CPU priority below kvviz's (Unix): it takes the time the generation leaves
FRAME_FORMAT = QImage.Format.Format_RGB32  # 4 bytes a pixel and never row padding: written to ffmpeg as is


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


def grab_window(target: QWidget) -> QImage:
    """What is on screen of `target` now: the window's painted pixels where the platform can hand them over, else
    the widget painted again (a child widget, or Wayland, which shares no pixels)."""
    pixmap = None
    if target.isWindow() and target.screen() is not None:
        pixmap = target.screen().grabWindow(target.winId())
    if pixmap is None or pixmap.isNull():
        pixmap = target.grab()
    return pixmap.toImage()


def frame(image: QImage, size: tuple[int, int]) -> QImage:
    """`image` as a FRAME_FORMAT frame of `size` (width, height): cropped, or padded in black where the window
    was made smaller while recording."""
    width, height = size
    if image.width() != width or image.height() != height:
        image = image.copy(QRect(0, 0, width, height))
    return image.convertToFormat(FRAME_FORMAT)


def _lower_priority() -> None:
    os.nice(ENCODER_NICENESS)


class _Mp4Writer:
    """ffmpeg reading raw frames from a pipe and encoding H.264 (ultrafast preset), at a lower priority."""

    def __init__(self, path: Path, size: tuple[int, int], fps: float):
        import imageio_ffmpeg

        width, height = size
        pixels = "bgra" if sys.byteorder == "little" else "argb"  # how Format_RGB32's 0xffRRGGBB lies in memory
        rate = str(Fraction(fps).limit_denominator())
        command = [
            imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-loglevel", "error",
            "-f", "rawvideo", "-pix_fmt", pixels, "-s", f"{width}x{height}", "-r", rate, "-i", "-",
            # the cheapest H.264 here: about 15 ms of CPU a 1080p frame, on one thread
            "-c:v", "libx264", "-preset", "ultrafast", "-tune", "zerolatency", "-threads", "1", "-crf", "23",
            "-pix_fmt", "yuv420p", str(path),
        ]
        self.path = path
        self._log = tempfile.TemporaryFile()
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=self._log,
            preexec_fn=_lower_priority if hasattr(os, "nice") else None,
        )

    def write(self, image: QImage, count: int) -> None:
        data = image.constBits()
        for _ in range(count):
            self._process.stdin.write(data)  # the pipe's write lets the other threads run meanwhile

    def close(self) -> None:
        try:
            self._process.stdin.close()
        except OSError:
            pass
        status = self._process.wait()
        self._log.seek(0)
        log = self._log.read().decode("utf-8", "replace").strip().splitlines()
        self._log.close()
        if status != 0:
            raise OSError(f"ffmpeg could not write {self.path}: {log[-1] if log else f'exit status {status}'}")


class _GifWriter:
    def __init__(self, path: Path, size: tuple[int, int], fps: float):
        self.path, self.fps, self.frames = path, fps, []
        width, height = size
        self.scale = 1 if width <= GIF_MAX_WIDTH else 2
        self._last: tuple[QImage, object] | None = None  # the last picture and its quantized frame

    def write(self, image: QImage, count: int) -> None:
        from PIL import Image

        if self._last is None or self._last[0] is not image:
            pixels = qimage_to_array(image)
            if self.scale > 1:
                pixels = pixels[:: self.scale, :: self.scale]
            self._last = (image, Image.fromarray(pixels).quantize(colors=255, method=Image.Quantize.FASTOCTREE))
        self.frames.extend([self._last[1]] * count)

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
        self.frames = 0  # frames given to the writer (including repeats); all written once stop() returns
        self.grabs = 0  # real grabs of the window
        self.grab_ms = 0.0  # GUI-thread time spent grabbing
        self.size: tuple[int, int] | None = None
        self.started = 0.0
        self.stopped = 0.0
        self._writer = None
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

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
        first = grab_window(self.target)
        self.size = (first.width() // 2 * 2, first.height() // 2 * 2)  # even, for H.264
        writer_type = _GifWriter if path.suffix.lower() == ".gif" else _Mp4Writer
        self._writer = writer_type(path, self.size, self.fps)
        self._queue = queue.Queue(maxsize=QUEUE_FRAMES)
        self._failure = None
        self._thread = threading.Thread(target=self._write_frames, name="kvviz-recorder", daemon=True)
        self._thread.start()
        self.frames = 0
        self.grabs = 1
        self.grab_ms = 0.0
        self.started = time.perf_counter()
        self._send(first, 1)
        self.timer.start(int(round(1000.0 / self.fps)))
        self.sigStarted.emit(str(path))
        return path

    def capture(self, wait: bool = False) -> None:
        """One tick: a picture of the window for the frames the clock asks for by now. While the writer is behind
        (its queue full) the tick passes, unless `wait`: the next picture then also stands for the frames
        missed, which repeat the picture before it."""
        if not self.recording:
            return
        due = int((time.perf_counter() - self.started) * self.fps) + 1  # frames that should exist by now
        count = due - self.frames
        if count <= 0 or (self._queue.full() and not wait):
            return
        t0 = time.perf_counter()
        image = grab_window(self.target)
        self.grabs += 1
        self.grab_ms += (time.perf_counter() - t0) * 1000.0
        self._send(image, count)

    def _send(self, image: QImage, count: int) -> None:
        """To the writer: the previous picture count - 1 more times, then this one."""
        self._queue.put((image, count))
        self.frames += count

    def _write_frames(self) -> None:
        """The writer thread: each picture after the repeats of the one before it that the clock asked for."""
        last = None
        while True:
            item = self._queue.get()
            if item is None:
                return
            image, count = item
            if self._failure is not None:
                continue
            try:
                image = frame(image, self.size)
                if last is not None and count > 1:
                    self._writer.write(last, count - 1)
                self._writer.write(image, 1 if last is not None else count)
            except (OSError, ValueError) as exc:  # ffmpeg ended (a full disk): stop() reports it
                self._failure = exc
            last = image

    def stop(self) -> Path | None:
        """Stop, write what is queued and close the file; its path. Raises OSError where it could not be written."""
        if not self.recording:
            return None
        self.timer.stop()
        self.capture(wait=True)
        self.stopped = time.perf_counter()
        self._queue.put(None)
        self._thread.join()
        writer, self._writer = self._writer, None
        try:
            writer.close()
        finally:
            self.sigStopped.emit(str(self.path), self.frames)
        if self._failure is not None:
            raise OSError(f"could not write {self.path}: {self._failure}")
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
    """The Record menu (Ctrl+R toggles) and the REC clock in the window's title; kept on the window as
    `window.recorder`."""

    def __init__(self, window: QMainWindow, dialogs: FileDialogs, fps: float = 10.0):
        super().__init__(window)
        self.window = window
        self.dialogs = dialogs
        self.fps = fps
        self.recorder = Recorder(window, self)
        self._title = window.windowTitle()
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
        self._title = self.window.windowTitle()
        path = self.recorder.start(path, fps or self.fps)
        self.action.setChecked(True)
        self.action.setText("Stop &recording")
        self._tick()
        self.clock.start()
        return path

    def stop(self) -> Path | None:
        self.clock.stop()
        self.action.setChecked(False)
        self.action.setText("&Record window…")
        self.window.setWindowTitle(self._title)
        try:
            path = self.recorder.stop()
        except OSError as exc:
            self.window.show_error(f"Recording failed: {exc}")
            return None
        if path is not None:
            self.window.say_saved(path, f"{self.recorder.frames} frames")
        return path

    def badge(self) -> str:
        """What the window's title says while recording ("" when not recording): the REC clock, and that the
        encoder shares the CPU with the generation (measured by kvviz.qt.tools.record_bench: about 5 % fewer tokens/s on
        two busy cores)."""
        if not self.recorder.recording:
            return ""
        seconds = int(self.recorder.elapsed())
        return f"● REC {seconds // 60:02d}:{seconds % 60:02d} · timings a few % slower while recording"

    def _tick(self) -> None:
        self.window.setWindowTitle(f"{self.badge()} · {self._title}")

    def _toggled(self, checked: bool) -> None:
        if not checked:
            self.stop()
            return
        suffix = "mp4" if have_ffmpeg() else "gif"
        path = self.dialogs.save_file("recordings", "Record window to", f"kvviz.{suffix}", "Video (*.mp4 *.gif)")
        if path:
            self.start(path)
        else:
            self.action.setChecked(False)


def install_recorder(window: QMainWindow, dialogs: FileDialogs, fps: float = 10.0) -> RecordControl:
    control = RecordControl(window, dialogs, fps)
    window.recorder = control
    return control
