"""A ``llama-server`` process the gates drive over HTTP, as a user's harness does: started from a
build's ``bin/``, bound to 127.0.0.1 on a free port, ready when ``GET /health`` answers 200, asked
through ``POST /tokenize``, ``/apply-template`` and ``/completion``, and stopped (SIGTERM, then
SIGKILL) whatever happens, Ctrl-C included.

The server's environment drops ``LLAMA_ARG_*`` (llama.cpp reads its options from those too), so only
the command line the gate logs decides how it runs. Where ``nvidia-smi`` is on PATH, the server's own
GPU memory is sampled every 0.5 s while it runs (:attr:`LlamaServer.gpu`: its peak, and how many
other processes used the GPU meanwhile).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dcaforge.errors import GateError

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def died_hint(rc: int | None) -> str | None:
    """What to do about a llama-server that exited with ``rc``: for an illegal instruction (SIGILL), how to build one
    this machine runs; None otherwise (the log's tail says the rest)."""
    if rc not in (-signal.SIGILL, 128 + signal.SIGILL):
        return None
    return ("it died of an illegal instruction (SIGILL): the build uses a CPU instruction this machine does not run. "
            "On a CPU with AMX, upstream ggml's AMX kernels stop like this, and `dcaforge build` now leaves them out "
            "of a native build: run `dcaforge build` again (it reconfigures). If it still stops (a build made on "
            "another machine, or a config that sets GGML_NATIVE or CMAKE_CXX_FLAGS), build a portable one: copy "
            "examples/upstream.yaml to ./dcaforge.yaml with `root: .` (or edit your config), add "
            "`defines: {GGML_NATIVE: OFF, GGML_AVX2: ON, GGML_FMA: ON, GGML_F16C: ON}` under build.cmake, and run "
            "`dcaforge build` again")


class HttpError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status, self.body = status, body


class LlamaServer:
    """``with LlamaServer(exe, args, log) as srv: srv.completion(...)``."""

    def __init__(self, exe: Path, args: Sequence[str], log: Path, *, load_timeout: float = 600.0,
                 request_timeout: float = 3600.0, on_wait: Callable[[float], None] | None = None) -> None:
        self.exe, self.args, self.log = exe, [str(a) for a in args], log
        self.load_timeout, self.request_timeout, self.on_wait = load_timeout, request_timeout, on_wait
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.argv: list[str] = []
        self.gpu: dict[str, int] | None = None  # {"gpu_mib_peak", "gpu_other_processes"} with nvidia-smi
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.port = free_port()
        self.argv = [str(self.exe), *self.args, "--host", HOST, "--port", str(self.port)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as fh:
            fh.write(("$ " + " ".join(self.argv) + "\n").encode())
            fh.flush()
            # its own session: a Ctrl-C at the terminal reaches dcaforge, which then stops the server itself
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        smi = shutil.which("nvidia-smi")
        if smi:
            self.gpu = {"gpu_mib_peak": 0, "gpu_other_processes": 0}
            self._sampling.set()
            self._sampler = threading.Thread(target=self._sample_gpu, args=(smi, self.proc.pid), daemon=True)
            self._sampler.start()
        self._wait_ready()

    def _sample_gpu(self, smi: str, pid: int) -> None:
        while self._sampling.is_set():
            try:
                out = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10, check=False).stdout
            except (OSError, subprocess.TimeoutExpired):
                return
            others = 0
            for line in out.splitlines():
                parts = [x.strip() for x in line.split(",")]
                if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
                    continue
                if int(parts[0]) == pid:
                    self.gpu["gpu_mib_peak"] = max(self.gpu["gpu_mib_peak"], int(parts[1]))  # type: ignore[index]
                else:
                    others += 1
            self.gpu["gpu_other_processes"] = max(self.gpu["gpu_other_processes"], others)  # type: ignore[index]
            time.sleep(0.5)

    def _tail(self, n: int = 12) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").strip().splitlines()[-n:])
        except OSError:
            return ""

    def _wait_ready(self) -> None:
        t0 = time.monotonic()
        while True:
            assert self.proc is not None
            rc = self.proc.poll()
            if rc is not None:
                raise GateError(f"llama-server exited (status {rc}) before it was ready", where=f"log: {self.log}",
                                hint=died_hint(rc), details=self._tail())
            try:
                status, _ = self._request("GET", "/health", None, timeout=5)
                if status == 200:
                    return
            except (OSError, HttpError):
                pass
            waited = time.monotonic() - t0
            if waited > self.load_timeout:
                self.stop()
                raise GateError(f"llama-server was not ready after {self.load_timeout:.0f} s", where=f"log: {self.log}",
                                details=self._tail(), hint="a large model or context loads slowly: raise 'load_timeout:'")
            if self.on_wait:
                self.on_wait(waited)
            time.sleep(0.2)

    def stop(self) -> None:
        self._sampling.clear()
        if self._sampler is not None:
            self._sampler.join(timeout=15)
            self._sampler = None
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=15)

    def _request(self, method: str, path: str, body: Any, *, timeout: float) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data is not None else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raise HttpError(exc.code, exc.read().decode("utf-8", "replace")) from None

    def post(self, path: str, body: dict[str, Any]) -> Any:
        if self.proc is None or self.proc.poll() is not None:
            rc = self.proc.poll() if self.proc else None
            raise GateError("llama-server is not running (it stopped or crashed)", where=f"log: {self.log}",
                            hint=died_hint(rc), details=self._tail())
        try:
            return self._request("POST", path, body, timeout=self.request_timeout)[1]
        except OSError as exc:  # the connection broke: most often the server died (out of memory, an abort)
            rc = self.proc.poll() if self.proc else None
            raise GateError(f"POST {path} failed: {exc}" + (f" (llama-server exited, status {rc})" if rc is not None else ""),
                            where=f"log: {self.log}", hint=died_hint(rc), details=self._tail()) from None

    def tokenize(self, text: str) -> list[int]:
        """The tokens ``/completion`` makes of ``text`` (BOS and special tokens as it adds them)."""
        return list(self.post("/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"])

    def apply_template(self, user: str) -> str:
        """``user`` as one user turn of the model's chat template, with the assistant's turn opened."""
        return str(self.post("/apply-template", {"messages": [{"role": "user", "content": user}]})["prompt"])

    def completion(self, prompt: str | list[int], n_predict: int, *, cache_prompt: bool = False) -> dict[str, Any]:
        """Greedy (temperature 0) continuation of ``prompt`` (text, or the tokens of :meth:`tokenize`)."""
        return dict(self.post("/completion", {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
                                              "seed": 0, "cache_prompt": cache_prompt, "stream": False}))
