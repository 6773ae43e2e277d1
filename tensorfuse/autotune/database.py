"""Where tuning records live, and how they are kept whole.

One MetaSchedule JSON database per device: ``<cache>/tuning/<device>-tensorfuse-<version>/`` with
``<cache>`` = ``$TENSORFUSE_CACHE`` or ``~/.cache/tensorfuse``; the device is the GPU's name and
compute capability, or the CPU's model. MetaSchedule appends one JSON line per record, so a job
killed mid-write can leave at most a torn last line: :func:`open_database` drops such lines (and
records whose workload line is missing) after copying the files aside, and says so. A lock file
keeps two jobs from writing one database at once.
"""
from __future__ import annotations

import fcntl
import functools
import json
import os
import platform
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass

from .. import __version__
from ..errors import TuningError
from ..targets import TargetSpec
from ..targets.triton.launch import cache_root

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"


def device_name(target: TargetSpec) -> str:
    """The device records are kept for: the GPU's name and compute capability, else the CPU model
    (ROCm targets, which cannot run here, by architecture)."""
    if target.kind == "cuda":
        return _cuda_name(target.arch)
    if target.kind == "rocm":
        return f"rocm-{target.arch}"
    return _cpu_model()


@functools.lru_cache(maxsize=None)
def _cuda_name(arch: str) -> str:
    """GPU 0's name and compute capability (asked of the driver once: every tuning-record lookup
    — each first call at a new size — names the database by it)."""
    import tvm

    dev = tvm.cuda(0)
    if dev.exist:
        return f"{dev.device_name}-cc{dev.compute_version.replace('.', '')}"
    return f"cuda-{arch}"


@functools.lru_cache(maxsize=None)
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def default_database_dir(target: TargetSpec) -> str:
    """The database folder for ``target`` on this machine."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", device_name(target)).strip("-").lower()
    return os.path.join(cache_root(), "tuning", f"{slug}-tensorfuse-{__version__}")


@dataclass
class Repair:
    """What :func:`repair_database` had to drop (nothing when both counts are 0)."""

    torn_lines: int = 0
    orphan_records: int = 0
    backup: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.torn_lines or self.orphan_records)


def _readable_lines(path: str) -> tuple[list[str], list[str], Repair]:
    """The workload and record lines that can be used, and what had to be left out."""
    workloads = _read_lines(os.path.join(path, WORKLOADS))
    records = _read_lines(os.path.join(path, RECORDS))
    good_workloads = [line for line, parsed in workloads if parsed is not None]
    repair = Repair(torn_lines=len(workloads) - len(good_workloads))
    if repair.torn_lines:  # a workload line lost mid-file would shift every index: refuse
        torn_at = [k for k, (_, parsed) in enumerate(workloads) if parsed is None]
        if torn_at != list(range(len(good_workloads), len(workloads))):
            raise TuningError(f"the tuning database {path} has an unreadable workload line "
                              f"{torn_at[0] + 1} that is not the last one; it was not written by "
                              "an interrupted job. Move the folder away to start afresh")
    good_records = []
    for line, parsed in records:
        if parsed is None:
            repair.torn_lines += 1
        elif not (isinstance(parsed, list) and isinstance(parsed[0], int)
                  and parsed[0] < len(good_workloads)):
            repair.orphan_records += 1
        else:
            good_records.append(line)
    return good_workloads, good_records, repair


def repair_database(path: str) -> Repair:
    """Drop unreadable lines and records without a workload from the database in ``path``; the
    originals are copied to ``path/backup-<time>/`` first and the files replaced atomically."""
    good_workloads, good_records, repair = _readable_lines(path)
    if repair.changed:
        repair.backup = os.path.join(path, f"backup-{time.strftime('%Y%m%d-%H%M%S')}")
        os.makedirs(repair.backup, exist_ok=True)
        for name in (WORKLOADS, RECORDS):
            if os.path.exists(os.path.join(path, name)):
                shutil.copy2(os.path.join(path, name), os.path.join(repair.backup, name))
        _write_atomically(os.path.join(path, WORKLOADS), good_workloads)
        _write_atomically(os.path.join(path, RECORDS), good_records)
    return repair


def _read_lines(path: str) -> list[tuple[str, object]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append((line, json.loads(line)))
        except json.JSONDecodeError:
            out.append((line, None))
    return out


def _write_atomically(path: str, lines: list[str]) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def open_database(path: str, read_only: bool = False):
    """A MetaSchedule ``JSONDatabase`` over ``path`` (created if missing), repaired first when an
    interrupted job left a torn line. ``read_only`` (lookups, which may run while a job is
    appending): never write ``path``; a torn line is left out of a private copy instead."""
    from tvm.s_tir import meta_schedule as ms

    if read_only:
        good_workloads, good_records, repair = _readable_lines(path)
        if repair.changed:
            path = tempfile.mkdtemp(prefix="tensorfuse-db-view-")
            _write_atomically(os.path.join(path, WORKLOADS), good_workloads)
            _write_atomically(os.path.join(path, RECORDS), good_records)
    else:
        os.makedirs(path, exist_ok=True)
        repair = repair_database(path)
        if repair.changed:
            warnings.warn(f"tuning database {path}: dropped {repair.torn_lines} torn line(s) and "
                          f"{repair.orphan_records} record(s) without a workload left by an "
                          f"interrupted job; the originals are in {repair.backup}", stacklevel=2)
    try:
        return ms.database.JSONDatabase(os.path.join(path, WORKLOADS), os.path.join(path, RECORDS),
                                        allow_missing=True)
    except Exception as exc:  # noqa: BLE001 - TVM reports a bad file as a generic error
        raise TuningError(f"cannot read the tuning database in {path}: {exc}") from None


class DatabaseLock:
    """An exclusive lock on a database folder for one tuning job (released when the process
    dies, so a killed job never leaves it locked). A second job on the same database waits for
    the first to finish (``say`` tells why it waits), so jobs are serialised, never interleaved:
    MetaSchedule numbers workloads by their line in the file, which two writers would corrupt.
    ``wait=False`` refuses instead."""

    def __init__(self, path: str, say=None, wait: bool = True):
        self.path = path
        self.say = say
        self.wait = wait
        self._file = None

    def __enter__(self) -> "DatabaseLock":
        os.makedirs(self.path, exist_ok=True)
        self._file = open(os.path.join(self.path, ".lock"), "a+", encoding="utf-8")
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            if not self.wait:
                self._file.close()
                raise TuningError(f"the tuning database {self.path} is in use by {holder}; wait "
                                  "for that job or pass another database=") from None
            if self.say is not None:
                self.say(f"the tuning database is in use by {holder}: this job starts when "
                         "that one ends")
            fcntl.flock(self._file, fcntl.LOCK_EX)
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()}")
        self._file.flush()
        return self

    def __exit__(self, *exc) -> None:
        fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()


def merge_databases(sources: list[str], into: str, say=print) -> int:
    """Add the records of the databases in ``sources`` (e.g. tuned on several hosts of one GPU
    model) to the one in ``into``, under its lock; records already there are not added twice.
    Returns how many were added."""
    from tvm.s_tir.meta_schedule.database import TuningRecord

    with DatabaseLock(into, say):
        target = open_database(into)
        seen = {_record_key(r) for r in target.get_all_tuning_records()}
        added = 0
        for source in sources:
            if os.path.abspath(source) == os.path.abspath(into):
                continue
            for record in open_database(source, read_only=True).get_all_tuning_records():
                workload = target.commit_workload(record.workload.mod)
                key = _record_key(record)
                if key in seen:
                    continue
                seen.add(key)
                target.commit_tuning_record(TuningRecord(record.trace, workload, record.run_secs,
                                                         record.target, record.args_info))
                added += 1
        say(f"merged {added} record(s) into {into}")
        return added


def _record_key(record) -> tuple:
    import tvm_ffi

    return (tvm_ffi.structural_hash(record.workload.mod), str(record.trace.as_json()),
            tuple(float(s) for s in (record.run_secs or [])))
