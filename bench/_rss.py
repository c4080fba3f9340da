"""RSS of this process sampled over time from a thread: total, anonymous and file-backed, threads, and
at the largest RSS seen the biggest mappings of /proc/self/smaps (heap, anonymous arenas, files)."""

from __future__ import annotations

import contextlib
import ctypes
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any


def _status() -> dict[str, int]:
    wanted = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem", "Threads": "threads"}
    found: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            found[wanted[key]] = int(value.split()[0])
    return found


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _malloc() -> dict[str, int]:
    """glibc's view (kB): obtained from the system by its arenas (``arena``: brk heap and thread arenas),
    in use there (``used``), free there (``free``), and large blocks it mmapped on their own (``mmapped``);
    plus the number of blocks Python's allocators hold (``py_blocks``)."""
    try:
        info = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return {}
    info.restype = _MallInfo2
    got = info()
    return {"arena": got.arena // 1024, "used": got.uordblks // 1024, "free": got.fordblks // 1024,
            "mmapped": got.hblkhd // 1024, "py_blocks": sys.getallocatedblocks()}


def smaps_top(limit: int = 12) -> list[dict[str, Any]]:
    """The mappings by RSS (kB), anonymous ones without a name grouped as ``[anon]`` with their count."""
    by_name: dict[str, dict[str, Any]] = {}
    name = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if not head:
            continue
        if "-" in head[0] and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else "[anon]"
            entry = by_name.setdefault(name, {"name": name, "rss_kb": 0, "mappings": 0})
            entry["mappings"] += 1
        elif head[0] == "Rss:":
            by_name[name]["rss_kb"] += int(head[1])
    return sorted(by_name.values(), key=lambda e: -e["rss_kb"])[:limit]


class RssSampler:
    """``with RssSampler(path, every=0.5):`` writes one JSON line per sample (kB; glibc's and Python's counts
    beside the kernel's), and the mappings at the peak last."""

    def __init__(self, path: str, *, every: float = 0.5) -> None:
        self._path, self._every = path, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self.marks: list[tuple[float, str]] = []

    def mark(self, what: str) -> None:
        self.marks.append((time.monotonic(), what))

    def __enter__(self) -> RssSampler:
        self._start = time.monotonic()
        Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        self._out = open(self._path, "w", encoding="utf-8")  # noqa: SIM115 - closed in __exit__
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for at, what in self.marks:
            self._out.write(json.dumps({"mark": what, "t": round(at - self._start, 2)}) + "\n")
        self._out.write(json.dumps({"peak_smaps": self._peak_smaps, "peak_kb": self._peak}) + "\n")
        self._out.close()

    def _loop(self) -> None:
        self._peak, self._peak_smaps = 0, []
        while not self._stop.wait(self._every):
            sample = {**_status(), **_malloc()}
            sample["t"] = round(time.monotonic() - self._start, 2)
            self._out.write(json.dumps(sample) + "\n")
            self._out.flush()
            if sample["rss"] > self._peak * 1.02:
                self._peak, self._peak_smaps = sample["rss"], smaps_top()
            self._peak = max(self._peak, sample["rss"])


def maybe_sampler(path: str | None) -> Any:
    """A sampler writing to ``path``, or a do-nothing context when there is none."""
    return RssSampler(path) if path else contextlib.nullcontext()
