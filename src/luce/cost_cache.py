"""The cost cache: step costs and acceptance that speculative runs measured, kept on disk so the
next run with the same target, drafter and device starts from them instead of calibrating
(native/src/spec_policy.h, seed()).

One JSON file per (target, drafter, device) in the cache folder:
    $LUCE_CACHE_DIR, else $XDG_CACHE_HOME/luce, else ~/.cache/luce
named costs-<key>.json, key = a hash of both files' identity (resolved path, size, mtime) and
the device's (CPU model and thread count, or the GPU's name). A file changed on disk gets a new
key, so its old costs are never read. LUCE_COST_CACHE=0 turns the cache off (nothing is read
or written).

A file that cannot be read or does not hold what it should is ignored (the run calibrates, then
writes a good one); a write goes to a temporary file renamed over the old one, so a reader never
sees half a file, and a cache folder that cannot be written is not an error.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

VERSION = 1
MAX_WIDTH = 32  # luce_generate_stats.width_seconds holds block rows 0..32


def enabled() -> bool:
    return os.environ.get("LUCE_COST_CACHE", "1").strip().lower() not in ("0", "off", "no", "false")


def cache_dir() -> Path:
    if os.environ.get("LUCE_CACHE_DIR"):
        return Path(os.environ["LUCE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "luce"


def _file_identity(path: Path) -> list:
    st = path.stat()
    return [str(path.resolve()), st.st_size, st.st_mtime_ns]


def device_identity(device: str, threads: int) -> str:
    """The hardware a cost was measured on: step costs move with it, acceptance does not."""
    if device == "gpu":
        for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
            for line in info.read_text(errors="replace").splitlines():
                if line.startswith("Model:"):
                    return "gpu:" + line.split(":", 1)[1].strip()
        return "gpu"
    model = "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu:{model}:threads={threads or os.cpu_count()}"


def cache_key(target: Path, drafter: Path, device: str) -> str:
    ident = json.dumps([_file_identity(target), _file_identity(drafter), device])
    return hashlib.sha256(ident.encode()).hexdigest()[:24]


def cache_path(key: str) -> Path:
    return cache_dir() / f"costs-{key}.json"


def _valid(entry) -> bool:
    def positive(x):
        return isinstance(x, (int, float)) and math.isfinite(x) and x > 0

    return (isinstance(entry, dict) and entry.get("version") == VERSION and positive(entry.get("plain_seconds"))
            and isinstance(entry.get("width_seconds"), dict) and entry["width_seconds"]
            and all(k.isdigit() and 2 <= int(k) <= MAX_WIDTH and positive(v) for k, v in entry["width_seconds"].items())
            and isinstance(entry.get("acceptance"), list) and len(entry["acceptance"]) <= MAX_WIDTH
            and all(isinstance(a, (int, float)) and 0 <= a <= 1 for a in entry["acceptance"]))


def load(key: str) -> dict | None:
    """The costs stored under key: {"plain_seconds", "width_seconds": {rows: s}, "acceptance": [..]},
    or None (none stored, the cache off, or a file that is not a valid entry)."""
    if not enabled():
        return None
    try:
        entry = json.loads(cache_path(key).read_text())
    except (OSError, ValueError):
        return None
    return entry if _valid(entry) else None


def merged(old: dict | None, stats: dict) -> dict | None:
    """The entry after a run: what it measured replaces what was stored, width by width; widths it
    did not run keep their stored cost. None when the run measured no step cost (nothing to keep)."""
    widths = dict((old or {}).get("width_seconds", {}))
    widths.update({str(w): s for w, s in enumerate(stats.get("width_seconds", [])) if 2 <= w and s > 0})
    plain = stats.get("plain_step_seconds") or (old or {}).get("plain_seconds")
    acceptance = list(stats.get("position_acceptance") or (old or {}).get("acceptance", []))
    entry = {"version": VERSION, "plain_seconds": plain, "width_seconds": widths, "acceptance": acceptance}
    return entry if _valid(entry) else None


def save(key: str, entry: dict) -> None:
    """Write atomically (temporary file, then rename); a folder that cannot be written is skipped."""
    if not enabled():
        return
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".costs-", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, indent=1, sort_keys=True)
            os.replace(tmp, cache_path(key))
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
