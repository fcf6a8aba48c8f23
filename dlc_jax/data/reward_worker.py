"""A reward worker process, ``python -m dlc_jax.data.reward_worker FD``: over socket ``FD`` it
receives the ``module:function`` paths, answers ``("ready", None)`` or ``("error", msg)``, then
serves ``(kind, fn_index, payload)`` on its main thread until ``None`` or EOF. A plain subprocess
(spawn would re-run the user's ``__main__``, fork would copy the threaded trainer)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:  # the trainer died: take the rewards' children with us
            try:
                os.killpg(0, signal.SIGKILL)
            finally:
                os._exit(0)


def _describe(e: BaseException) -> str:
    where = traceback.extract_tb(e.__traceback__)[-1:]
    at = f" at {os.path.basename(where[0].filename)}:{where[0].lineno}" if where else ""
    return f"{type(e).__name__}: {e}{at}"


def serve(conn: Connection) -> None:
    from dlc_jax.data.rewards import as_reward_list, resolve_fn

    paths = conn.recv()
    try:
        fns = [resolve_fn(p) for p in paths]
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        conn.send(("error", str(e)))
        return
    conn.send(("ready", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        kind, i, payload = msg
        try:
            if kind == "score":
                prompts, completions, answers, kwargs = payload
                out = as_reward_list(fns[i](prompts, completions, answers, **kwargs))
                conn.send(("err", out) if isinstance(out, str) else ("ok", out))
            elif kind == "check":
                check = getattr(fns[i], "check_answer", None)
                conn.send(("ok", [check(a) if check else None for a in payload]))
            else:
                conn.send(("err", f"unknown request {kind!r}"))
        except Exception as e:  # noqa: BLE001 - a failing reward must never end the worker
            conn.send(("err", _describe(e)))


def main(argv: list[str]) -> int:
    # a terminal's Ctrl-C reaches the whole process group: the trainer handles it and stops us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(argv[0]))
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    try:
        serve(conn)
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
