"""The one owner of "this request is stale".

A completion request is stale once the user moved on (a newer request for the same document,
an answer from memory, the document closed, the session ended) or the client cancelled it
($/cancelRequest). Everything that waits on a request (the debounce, the queue for the engine
thread, the generation itself) asks its Ticket; nothing else keeps a second notion of stale.

Promises:
- A document has at most one live ticket: `issue` makes the previous one stale ("superseded")
  at once, so whatever awaits it returns without waiting for the clock or the engine.
- Stale is final and the first reason wins: a request superseded and then cancelled stays
  "superseded".
- Going stale sets the ticket's CancelToken, which the engine (and a remote stream) checks
  between forward passes: no forward is spent on a stale request after the one running.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from codespec_lsp.engine.api import CancelToken

SUPERSEDED = "superseded"
CANCELLED = "cancelled"


class Ticket:
    """One request's claim on its document; `cancel` is what the backend is handed."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.cancel = CancelToken()
        self.reason: str | None = None   # SUPERSEDED | CANCELLED once stale
        self._stale = asyncio.Event()

    @property
    def stale(self) -> bool:
        return self.reason is not None

    def expire(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.cancel.cancel()
            self._stale.set()

    async def until(self, fut: asyncio.Future) -> None:
        """Wait until `fut` is done or this ticket goes stale, whichever comes first; `fut`
        itself is left running (an engine call ends at its own next check)."""
        if self.stale or fut.done():
            return
        stale = asyncio.ensure_future(self._stale.wait())
        try:
            await asyncio.wait([fut, stale], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stale.cancel()


class Supersede:
    """Tickets by document. `sleep` is injectable, so debounce tests run on a fake clock."""

    def __init__(self, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self._sleep = sleep
        self._live: dict[str, Ticket] = {}

    def issue(self, key: str) -> Ticket:
        """The newest request for `key`: the one before it, if any, is superseded."""
        self.supersede(key)
        ticket = self._live[key] = Ticket(key)
        return ticket

    def supersede(self, key: str) -> None:
        """The user moved on without new work for `key` (an answer from memory, a close)."""
        if (old := self._live.pop(key, None)) is not None:
            old.expire(SUPERSEDED)

    def release(self, ticket: Ticket) -> None:
        """`ticket`'s request ended; a newer one for its document keeps its own."""
        if self._live.get(ticket.key) is ticket:
            del self._live[ticket.key]

    def close(self) -> None:
        for key in list(self._live):
            self.supersede(key)

    async def debounce(self, ticket: Ticket, delay_s: float) -> bool:
        """True once `delay_s` passed with `ticket` still live; False as soon as it is stale."""
        if delay_s > 0 and not ticket.stale:
            sleeper = asyncio.ensure_future(self._sleep(delay_s))
            try:
                await ticket.until(sleeper)
            finally:
                sleeper.cancel()
        return not ticket.stale
