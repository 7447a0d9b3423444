"""`in_threads(action, items, limit)`: run `action` on every item, at most `limit` at a time, in plain threads.

Checkpoint writes, uploads and digests run here rather than in a `concurrent.futures` pool because an
asynchronous save nobody waited for is finished while the interpreter exits (Python joins the writer thread then),
and `ThreadPoolExecutor` refuses new work once shutdown has begun ("cannot schedule new futures after interpreter
shutdown"): the save was lost. Plain threads still start then.
"""

from __future__ import annotations

import threading


def in_threads(action, items: list, limit: int) -> list:
    """[action(item) for item in items], computed by up to `limit` threads; re-raises the first error (by item)."""
    items = list(items)
    if len(items) <= 1 or limit <= 1:
        return [action(item) for item in items]
    results: list = [None] * len(items)
    errors: list = [None] * len(items)
    cursor = iter(range(len(items)))
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                index = next(cursor, None)
            if index is None:
                return
            try:
                results[index] = action(items[index])
            except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread below
                errors[index] = error

    threads = [threading.Thread(target=work, name="hasten-checkpoint-io", daemon=True)
               for _ in range(min(limit, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    first = next((error for error in errors if error is not None), None)
    if first is not None:
        raise first
    return results
