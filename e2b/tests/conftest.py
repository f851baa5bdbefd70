"""Shared fixtures: the node is named by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
(set by sandboxd/tests/e2b.rs); every sandbox a test creates is killed after it."""

import pytest
import pytest_asyncio
from e2b import AsyncSandbox, Sandbox


@pytest.fixture
def sandbox():
    sbx = Sandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        sbx.kill()


@pytest_asyncio.fixture
async def async_sandbox():
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        yield sbx
    finally:
        await sbx.kill()
