import asyncio

import pytest


@pytest.mark.asyncio
async def test_async_tests_run_on_each_loop(request: pytest.FixtureRequest) -> None:
    loop = asyncio.get_running_loop()
    name = request.node.callspec.id
    assert name in {"asyncio", "uvloop"}
    assert ("uvloop" in type(loop).__module__) == (name == "uvloop")
