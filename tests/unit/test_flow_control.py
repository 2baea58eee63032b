"""The tunnel's flow control (inside_job/frames.py): a sender's credit and a receiver's account of
one stream, the WINDOW frame, and the server's side of a stream (broker/route_proxy/hub.py), which
holds at most a window of an app's data and closes a stream that goes past it."""

from __future__ import annotations

import asyncio

import pytest

from broker.route_proxy.hub import CONTROLS_HELD, MAX_STREAMS, Instance, StreamsFull
from inside_job import frames

W = 1000  # a small window keeps the arithmetic readable


def test_a_sender_spends_its_window_and_waits_for_grants() -> None:
    window = frames.SendWindow(W)
    assert window.room() == W and window.allows(W)
    window.spend(600)
    assert window.room() == 400
    assert window.allows(400) and not window.allows(401)
    with pytest.raises(ValueError, match="past the stream's window"):
        window.spend(401)
    window.spend(400)
    assert window.room() == 0 and not window.allows(1)
    window.grant(250)
    assert window.room() == 250


def test_a_grant_past_what_was_sent_is_refused() -> None:
    window = frames.SendWindow(W)
    window.spend(100)
    with pytest.raises(ValueError):
        window.grant(101)
    with pytest.raises(ValueError):
        window.grant(0)
    window.grant(100)
    assert window.credit == W


def test_a_message_longer_than_the_window_goes_alone() -> None:
    window = frames.SendWindow(W)
    window.spend(1)
    assert not window.allows(5000)  # it waits for the whole window
    window.grant(1)
    assert window.allows(5000)
    window.spend(5000)
    assert window.credit == W - 5000 and window.room() == 0 and not window.allows(1)
    window.grant(5000)
    assert window.credit == W


def test_a_receiver_holds_at_most_a_window() -> None:
    account = frames.ReceiveWindow(W)
    assert account.receive(600) and account.receive(400)
    assert not account.receive(1)  # the sender went past its window
    assert account.held == W


def test_a_receiver_grants_back_in_batches_and_when_it_holds_nothing() -> None:
    account = frames.ReceiveWindow(W)
    for _ in range(4):
        assert account.receive(100)
    assert account.passed_on(100) == 0  # 100 passed on, 300 still held: not worth a frame
    assert account.passed_on(100) == 0
    assert account.passed_on(100) == 0
    assert account.held == 100
    assert account.passed_on(100) == 400  # nothing held: everything goes back at once
    assert (account.held, account.ungranted) == (0, 0)
    for _ in range(6):
        assert account.receive(100)
    assert account.passed_on(500) == 500  # half a window: worth a frame


def test_the_sender_and_receiver_agree_on_a_long_message() -> None:
    """A long message is accepted only when the receiver holds nothing, which is exactly when
    its sender has the whole window back."""
    sender, receiver = frames.SendWindow(W), frames.ReceiveWindow(W)
    sender.spend(10)
    assert receiver.receive(10)
    assert not receiver.receive(5000) and not sender.allows(5000)
    sender.grant(receiver.passed_on(10))
    assert not receiver.receive(5000)  # a body's piece never goes past the window
    assert sender.allows(5000) and receiver.receive(5000, message=True)
    sender.spend(5000)
    sender.grant(receiver.passed_on(5000))
    assert sender.credit == W


def test_window_frames_round_trip_and_bad_ones_are_refused() -> None:
    stream, kind, payload = frames.decode(frames.encode_window(7, 65536))
    assert (stream, kind, frames.window_increment(payload)) == (7, frames.WINDOW, 65536)
    for bad in (b"", b"\x00\x00\x01", b"\x00\x00\x00\x00", b"\x00\x00\x00\x01\x00"):
        with pytest.raises(ValueError):
            frames.window_increment(bad)


def test_ready_says_the_framing_version() -> None:
    assert frames.ready_version(b"") == 1  # a runner from before flow control
    assert frames.ready_version(b"not json") == 1
    assert frames.ready_version(b'{"version": "2"}') == 1
    assert frames.ready_version(b'{"version": 2}') == frames.VERSION == 2


def _instance() -> tuple[Instance, list[bytes]]:
    sent: list[bytes] = []

    async def send_frame(frame: bytes) -> None:
        sent.append(frame)

    return Instance(1, "r", "strip", send_frame), sent


def test_the_hub_holds_a_window_of_an_apps_data_then_closes_the_stream() -> None:
    async def scenario() -> None:
        instance, sent = _instance()
        stream = instance.open_stream()
        piece = b"x" * 65536
        for _ in range(frames.WINDOW_BYTES // len(piece)):
            assert instance.deliver(stream.id, frames.BODY, piece) is None
        assert instance.buffered() == frames.WINDOW_BYTES
        problem = instance.deliver(stream.id, frames.BODY, b"y")
        assert problem == "the app sent past the stream's window"
        assert stream.closed and instance.buffered() == frames.WINDOW_BYTES
        assert instance.deliver(stream.id, frames.BODY, piece) is None  # dropped, not held
        assert instance.buffered() == frames.WINDOW_BYTES
        kinds = [(await stream.take())[0] for _ in range(stream.inbox.qsize())]
        assert kinds == [frames.BODY] * 4 + [frames.CLOSE]
        assert sent == []  # the tunnel tells the runner; the hub only holds

    asyncio.run(scenario())


def test_the_hub_grants_back_what_reached_the_caller() -> None:
    async def scenario() -> None:
        instance, sent = _instance()
        stream = instance.open_stream()
        assert instance.deliver(stream.id, frames.BODY, b"a" * 100) is None
        kind, payload = await stream.take()
        await instance.passed_on(stream, len(payload))
        assert [frames.decode(f)[:2] for f in sent] == [(stream.id, frames.WINDOW)]
        assert frames.window_increment(frames.decode(sent[0])[2]) == 100

    asyncio.run(scenario())


def test_the_hub_sends_a_body_as_the_runner_grants_credit() -> None:
    async def scenario() -> None:
        instance, sent = _instance()
        stream = instance.open_stream()
        body = bytes(range(256)) * 2048  # 512 KiB: two windows
        upload = asyncio.create_task(instance.send_body(stream, body, 65536))
        while stream.sending.room():
            await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        assert not upload.done()
        assert sum(len(frames.decode(f)[2]) for f in sent) == frames.WINDOW_BYTES
        instance.deliver(stream.id, frames.WINDOW, (frames.WINDOW_BYTES).to_bytes(4, "big"))
        await asyncio.wait_for(upload, 5)
        assert b"".join(frames.decode(f)[2] for f in sent) == body

    asyncio.run(scenario())


def test_a_waiting_sender_learns_the_stream_ended() -> None:
    async def scenario() -> None:
        instance, _ = _instance()
        stream = instance.open_stream()
        stream.sending.spend(frames.WINDOW_BYTES)
        waiting = asyncio.create_task(instance.send_message(stream, frames.WS_TEXT, b"hi"))
        await asyncio.sleep(0.01)
        instance.fail_all()
        with pytest.raises(Exception, match="the stream ended"):
            await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())


def test_streams_and_control_frames_are_bounded() -> None:
    async def scenario() -> None:
        instance, _ = _instance()
        streams = [instance.open_stream() for _ in range(MAX_STREAMS)]
        with pytest.raises(StreamsFull, match=f"{MAX_STREAMS} requests in flight"):
            instance.open_stream()
        instance.close_stream(streams[0].id)
        instance.open_stream()
        stream = streams[1]
        for _ in range(CONTROLS_HELD):
            assert instance.deliver(stream.id, frames.RESPONSE, b"{}") is None
        assert instance.deliver(stream.id, frames.RESPONSE, b"{}") is not None

    asyncio.run(scenario())
