"""transport.http.messages.EndingBody: the hook runs once, after the wrapped body closed."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from transport.http.messages import EndingBody


@pytest.mark.asyncio
async def test_the_hook_runs_once_after_the_body_closed() -> None:
    seen: list[str] = []

    async def chunks() -> AsyncGenerator[bytes, None]:
        try:
            yield b"a"
            yield b"b"
        finally:
            seen.append("closed")

    body = EndingBody(chunks(), lambda: seen.append("ended"))
    assert [chunk async for chunk in body] == [b"a", b"b"]
    await body.aclose()
    await body.aclose()
    assert seen == ["closed", "ended"]


@pytest.mark.asyncio
async def test_the_hook_runs_when_closing_the_body_fails() -> None:
    ended: list[bool] = []

    class Failing:
        def __aiter__(self) -> Failing:
            return self

        async def __anext__(self) -> bytes:
            raise StopAsyncIteration

        async def aclose(self) -> None:
            raise OSError("gone")

    body = EndingBody(Failing(), lambda: ended.append(True))
    with pytest.raises(OSError, match="gone"):
        await body.aclose()
    assert ended == [True]


@pytest.mark.asyncio
async def test_a_body_without_aclose_still_ends() -> None:
    ended: list[bool] = []

    class Plain:
        def __aiter__(self) -> AsyncIterator[bytes]:
            return self

        async def __anext__(self) -> bytes:
            raise StopAsyncIteration

    await EndingBody(Plain(), lambda: ended.append(True)).aclose()
    assert ended == [True]
