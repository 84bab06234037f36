"""Start and stop a real vLLM OpenAI-compatible server on loopback (for tests and recordings).

The server runs from its own venv's python (vLLM pins torch and transformers apart from kvviz),
in its own process group, so `stop()` ends it and its engine core children together.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx


def die_with_parent() -> None:
    """In the child, before exec: on Linux, get SIGTERM when the process that started us dies,
    so a test runner killed by a timeout does not leave a server behind. (Linux ties this to the
    thread that started the child: start the server from a thread that outlives it.)"""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    def __init__(
        self,
        python: str,
        model_dir: str,
        port: int | None = None,
        kv_space_gib: int = 1,
        max_model_len: int = 2048,
        dtype: str = "bfloat16",
        threads: int = 1,
        log_path: str | os.PathLike | None = None,
        extra: list[str] | None = None,
    ) -> None:
        self.python, self.model_dir = python, str(model_dir)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model_dir,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            str(max_model_len),
            "--dtype",
            dtype,
            "--enable-prefix-caching",
            *(extra or []),
        ]
        self.env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib),
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "OMP_NUM_THREADS": str(threads),
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        }
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None

    def start(self, timeout: float = 300.0) -> VllmServer:
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.args,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        if self.log_path:
            log.close()  # the child holds its own copy
        try:
            self._wait_healthy(t0, timeout)
        except BaseException:  # failed, timed out or interrupted while starting: leave nothing running
            self.stop()
            raise
        return self

    def _wait_healthy(self, t0: float, timeout: float) -> None:
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() - t0 < timeout:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the vLLM server exited with status {self.proc.returncode} while starting"
                        + (f"; see {self.log_path}" if self.log_path else "")
                    )
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        self.start_s = time.monotonic() - t0
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(1.0)
        raise RuntimeError(f"the vLLM server did not answer /health within {timeout:g} s")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after `timeout` seconds (bounded either way)."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the leader's pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        try:  # a front process stuck on a dead engine, or an engine core outliving its front process
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
