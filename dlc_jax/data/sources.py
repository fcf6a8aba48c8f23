"""Random-access row sources of the prompt pipeline: ``arithmetic`` (synthetic), ``PATH.jsonl`` /
``PATH.parquet`` and ``hf:NAME_OR_PATH`` (a ``save_to_disk`` directory, a data directory or a hub
name). Hostile input ends in a one-line `DataError` naming ``file:line`` or the row."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from dlc_jax.data.arithmetic import ArithmeticConfig, ArithmeticSource


class DataError(ValueError):
    """A problem with the data set; the message is one line and names the file/line or row."""


class RowSource:
    """The rows of a data set (a sequence of dicts: a list, the synthetic task) with where each
    came from; ``lines``: each row's 1-based file line (JSONL)."""

    def __init__(self, name: str, rows: Any, lines: list[int] | None = None):
        self.name, self.rows, self.lines = name, rows, lines

    def __len__(self) -> int:
        return len(self.rows)

    def row(self, i: int) -> dict:
        return self.rows[int(i)]

    def where(self, i: int) -> str:
        return f"{self.name}:{self.lines[i]}" if self.lines is not None else f"{self.name} row {i}"

    def iter_rows(self):
        """``(i, row)`` for every row, in order."""
        return ((i, self.row(i)) for i in range(len(self)))


class HFSource(RowSource):
    """A ``datasets.Dataset`` (memory-mapped: rows read on access), scanned in batches."""

    def iter_rows(self):
        i = 0
        for batch in self.rows.iter(batch_size=1024):
            cols = list(batch)
            for j in range(len(batch[cols[0]]) if cols else 0):
                yield i, {c: batch[c][j] for c in cols}
                i += 1


def _no_surrogates(value: Any) -> str | None:
    """The first string in ``value`` (nested) that is not valid Unicode text (a lone surrogate, as
    JSON's ``"\\ud800"`` decodes to), as its repr; None when all are fine."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return repr(value[:40])
        return None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((bad for v in items if (bad := _no_surrogates(v)) is not None), None)


def read_jsonl(path: Path) -> RowSource:
    rows, lines = [], []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, 1):
            at = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{at}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{at}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(rec, dict):
                raise DataError(f"{at}: expected a JSON object, got {type(rec).__name__}")
            bad = _no_surrogates(rec)
            if bad is not None:
                raise DataError(f"{at}: a lone surrogate (not valid text) in {bad}")
            rows.append(rec)
            lines.append(lineno)
    return RowSource(str(path), rows, lines)


def read_parquet(path: Path) -> RowSource:
    import pyarrow.parquet as pq

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
        raise DataError(f"{path}: cannot read Parquet ({type(e).__name__}: {e})") from None
    return RowSource(str(path), rows)


DEFAULT_TIMEOUT_S = 300.0


def with_deadline(fn, timeout_s: float, what: str):
    """``fn()`` in a daemon thread; a DataError naming ``what`` past ``timeout_s`` (the thread is
    abandoned: a network read that never returns cannot be interrupted)."""
    box: dict[str, Any] = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="dlc-jax-data-load", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise DataError(
            f"{what}: no answer within data.timeout_s={timeout_s:g} s (network down, or an "
            "endpoint that does not answer; HF_DATASETS_OFFLINE=1 uses the local cache only)"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]


def _hub_timeouts(timeout_s: float) -> None:
    """The hub client's HTTP timeouts at most ``timeout_s`` (unless the user set them)."""
    t = str(max(1, int(timeout_s)))
    for var in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
        os.environ.setdefault(var, t)
    with contextlib.suppress(ImportError):
        from huggingface_hub import constants

        for name in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):
            if hasattr(constants, name):
                setattr(constants, name, min(getattr(constants, name), int(t)))


def read_hf(
    spec: str, split: str, subset: str = "", timeout_s: float = DEFAULT_TIMEOUT_S
) -> HFSource:
    """The ``split`` of HF data set ``spec`` (saved, a data dir, a hub name) in ``timeout_s``."""
    label = f"hf:{spec}" + (f"/{subset}" if subset else "") + f"[{split}]"
    _hub_timeouts(timeout_s)
    ds = with_deadline(lambda: _load_hf(spec, split, subset, label), timeout_s, label)
    if len(ds) == 0:
        raise DataError(f"data.source: {label} has no rows")
    return HFSource(label, ds)


def _load_hf(spec: str, split: str, subset: str, label: str) -> Any:
    import datasets

    path = Path(spec).expanduser()
    try:
        saved = ("dataset_info.json", "dataset_dict.json", "state.json")
        if path.is_dir() and any((path / f).exists() for f in saved):
            try:
                ds = datasets.load_from_disk(str(path))
            except IndexError:  # datasets' own failure on a saved data set with no data files
                raise DataError(f"data.source: {label} has no rows (no data files)") from None
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(
                        f"data.split: {split!r} is not a split of {label} (splits: {sorted(ds)})"
                    )
                ds = ds[split]
            else:  # one saved Dataset: it is the split it was saved as ("train" when unnamed)
                have = str(ds.split) if ds.split is not None else "train"
                if split != have:
                    raise DataError(
                        f"data.split: {split!r} cannot be selected: hf:{spec} is a single saved "
                        f"Dataset (split {have!r}); use data.split={have} or save a DatasetDict"
                    )
        elif path.exists() and not path.is_dir():
            raise DataError(
                f"data.source: {spec!r} is a file; use it without 'hf:' (.jsonl/.parquet)"
            )
        else:
            if spec.startswith(("/", ".", "~")) and not path.exists():
                raise DataError(f"data.source: no such directory {spec!r}")
            ds = datasets.load_dataset(
                str(path) if path.is_dir() else spec, subset or None, split=split
            )
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - datasets raises many types; report one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DataError(f"data.source: cannot load {label} ({type(e).__name__}: {msg})") from None
    return ds


def open_source(
    source: str,
    *,
    split: str = "train",
    subset: str = "",
    arithmetic: ArithmeticConfig | None = None,
    seed: int = 0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> RowSource:
    """The :class:`RowSource` of ``data.source`` (module doc); one-line DataError if unreadable."""
    if source == "arithmetic":
        return RowSource("arithmetic", ArithmeticSource(arithmetic or ArithmeticConfig(), seed))
    if source.startswith("hf:"):
        return read_hf(source[3:], split, subset, timeout_s)
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"data.source: no such file {source!r}")
    if path.is_dir():
        raise DataError(
            f"data.source: {source!r} is a directory; use 'hf:{source}' for a datasets directory"
        )
    if path.suffix == ".jsonl":
        src: RowSource = read_jsonl(path)
    elif path.suffix == ".parquet":
        src = read_parquet(path)
    else:
        raise DataError(
            f"data.source: unsupported file type {path.suffix!r} of {source!r} "
            "(use .jsonl, .parquet, 'hf:NAME_OR_PATH' or 'arithmetic')"
        )
    if len(src) == 0:
        raise DataError(f"data.source: {source!r} has no records")
    return src
