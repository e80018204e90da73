"""The one owner of "this request is stale" (lsp/supersede.py), on a fake clock."""

import asyncio

from codespec_lsp.lsp.supersede import CANCELLED, SUPERSEDED, Supersede
from test_scheduler import FakeClock, settle


async def test_debounce_fires_after_delay():
    clock = FakeClock()
    s = Supersede(clock.sleep)
    t = asyncio.ensure_future(s.debounce(s.issue("a"), 0.1))
    await settle()
    assert not t.done()
    clock.advance(0.1)
    await settle()
    assert t.result() is True


async def test_a_newer_request_releases_the_older_at_once():
    clock = FakeClock()
    s = Supersede(clock.sleep)
    older = s.issue("a")
    first = asyncio.ensure_future(s.debounce(older, 0.1))
    await settle()
    second = asyncio.ensure_future(s.debounce(s.issue("a"), 0.1))
    await settle()
    assert first.done() and first.result() is False  # no clock advance needed
    assert older.reason == SUPERSEDED and older.cancel.cancelled  # the engine's token too
    clock.advance(0.1)
    await settle()
    assert second.result() is True


async def test_tickets_are_per_document():
    clock = FakeClock()
    s = Supersede(clock.sleep)
    a = asyncio.ensure_future(s.debounce(s.issue("a"), 0.1))
    b = asyncio.ensure_future(s.debounce(s.issue("b"), 0.1))
    await settle()
    clock.advance(0.2)
    await settle()
    assert a.result() is True and b.result() is True


async def test_until_returns_when_stale_and_leaves_the_work_running():
    s = Supersede()
    ticket = s.issue("a")
    work = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(ticket.until(work))
    await settle()
    assert not waiting.done()
    s.supersede("a")  # e.g. an answer from memory for the same document
    await settle()
    assert waiting.done() and not work.done() and not work.cancelled()


async def test_stale_is_final_and_the_first_reason_wins():
    s = Supersede()
    ticket = s.issue("a")
    ticket.expire(CANCELLED)
    s.issue("a")  # superseding an already cancelled request does not rename it
    assert ticket.reason == CANCELLED and ticket.stale


async def test_release_keeps_a_newer_ticket_and_close_makes_all_stale():
    s = Supersede()
    old = s.issue("a")
    new = s.issue("a")
    s.release(old)  # the old request ends after the new one began
    other = s.issue("b")
    s.close()
    assert new.reason == SUPERSEDED and other.reason == SUPERSEDED
