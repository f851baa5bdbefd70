"""Pause and resume against a node on the QEMU engine (set up by
sandboxd/tests/qemu_e2b.rs): pause is hibernate (the VM written out, its memory freed),
a second pause says "already paused", and connect wakes the sandbox with its files and
processes as they were. The sync and the async client, one sandbox each."""

import pytest
from e2b import AsyncSandbox, Sandbox


def test_pause_and_connect_sync():
    sbx = Sandbox.create(timeout=300)
    try:
        sbx.files.write("/tmp/state.txt", "kept across a pause\n")
        assert sbx.pause() is True
        info = Sandbox.get_info(sbx.sandbox_id)
        assert info.state.value == "paused", info
        listed = [s for s in Sandbox.list().next_items() if s.sandbox_id == sbx.sandbox_id]
        assert [str(s.state.value) for s in listed] == ["paused"], listed
        # The SDK reads 409 as "already paused".
        assert Sandbox.pause(sbx.sandbox_id) is False
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.files.read("/tmp/state.txt") == "kept across a pause\n"
        assert again.commands.run("cat /tmp/state.txt").stdout == "kept across a pause\n"
        assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"
    finally:
        sbx.kill()


@pytest.mark.asyncio(loop_scope="function")
async def test_pause_and_connect_async():
    sbx = await AsyncSandbox.create(timeout=300)
    try:
        await sbx.files.write("/tmp/state.txt", "async state\n")
        assert await sbx.pause() is True
        # An agent call to a paused sandbox wakes it too (no connect first).
        assert (await sbx.commands.run("cat /tmp/state.txt")).stdout == "async state\n"
        assert (await AsyncSandbox.get_info(sbx.sandbox_id)).state.value == "running"
    finally:
        await sbx.kill()
