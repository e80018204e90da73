"""Closing the remote backend's event loop thread leaves no task pending (issue 28: "Task was
destroyed but it is pending" when the remote backend closed with a stream or a scrape open)."""

import asyncio
import gc
import logging
import time

from codespec_lsp.remote.backend import LoopThread


def test_stop_ends_every_task_and_closes_the_loop(caplog):
    lt = LoopThread()
    started = []

    async def stream_cleanup_takes_a_while():
        # Like httpx closing a stream: a cancelled task that still awaits while it cleans up.
        started.append(True)
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            raise

    fut = lt.submit(stream_cleanup_takes_a_while())
    deadline = time.monotonic() + 5
    while not started and time.monotonic() < deadline:
        time.sleep(0.01)
    loop = lt.loop
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        lt.stop()
        assert loop.is_closed() and fut.cancelled()
        del lt, loop, fut
        gc.collect()
    assert not [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
