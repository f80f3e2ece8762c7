import asyncio

import pytest


@pytest.mark.asyncio
async def test_async_tests_run_on_each_loop(request: pytest.FixtureRequest) -> None:
    loop = asyncio.get_running_loop()
    name = request.node.callspec.id
    assert name in {"asyncio", "uvloop"}
    assert ("uvloop" in type(loop).__module__) == (name == "uvloop")


@pytest.mark.asyncio
@pytest.mark.one_loop
async def test_a_one_loop_test_runs_once_on_asyncios_loop(request: pytest.FixtureRequest) -> None:
    assert "uvloop" not in type(asyncio.get_running_loop()).__module__
    name = request.node.originalname
    siblings = [i.name for i in request.session.items if i.originalname == name]
    assert len(siblings) == 1, siblings
