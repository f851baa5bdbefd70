"""The same scenarios through the official SDK's async client (`AsyncSandbox`), whose
watch is the `WatchDir` server stream rather than the sync client's polled watcher."""

import asyncio
import os
import uuid

import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileType,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    SandboxException,
    SandboxQuery,
)

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def until(pred, what, within=60.0):
    """Waits for a condition (the events it reads arrive on the loop meanwhile)."""
    deadline = asyncio.get_running_loop().time() + within
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, f"timed out: {what}"
        await asyncio.sleep(0.05)


async def test_create_info_kill():
    sbx = await AsyncSandbox.create(timeout=60, metadata={"suite": "async"})
    try:
        assert await sbx.is_running()
        info = await sbx.get_info()
        assert (info.sandbox_id, info.metadata) == (sbx.sandbox_id, {"suite": "async"})
    finally:
        assert await sbx.kill() is True
    assert not await sbx.is_running()
    assert await AsyncSandbox.kill(sbx.sandbox_id) is False


async def test_list_with_metadata_filter_and_timeout():
    tag = uuid.uuid4().hex
    a = await AsyncSandbox.create(timeout=60, metadata={"run": tag, "role": "a"})
    b = await AsyncSandbox.create(timeout=60, metadata={"run": tag, "role": "b"})
    try:
        found = await AsyncSandbox.list(query=SandboxQuery(metadata={"run": tag})).next_items()
        assert sorted(s.sandbox_id for s in found) == sorted([a.sandbox_id, b.sandbox_id])
        only_a = await AsyncSandbox.list(
            query=SandboxQuery(metadata={"run": tag, "role": "a"})
        ).next_items()
        assert [s.sandbox_id for s in only_a] == [a.sandbox_id]
        before = (await b.get_info()).end_at
        await b.set_timeout(100)
        assert (await b.get_info()).end_at > before
    finally:
        await a.kill()
        await b.kill()


async def test_short_timeout_ends_the_sandbox():
    sbx = await AsyncSandbox.create(timeout=2)
    running = [True]

    async def poll():
        running[0] = await sbx.is_running()

    deadline = asyncio.get_running_loop().time() + 60
    while running[0]:
        assert asyncio.get_running_loop().time() < deadline, "outlived its timeout"
        await poll()
        await asyncio.sleep(0.2)
    with pytest.raises(NotFoundException):
        await sbx.get_info()


async def test_pause_is_refused_and_connect_works(async_sandbox):
    with pytest.raises(SandboxException) as e:
        await async_sandbox.pause()
    assert "501" in str(e.value)
    again = await AsyncSandbox.connect(async_sandbox.sandbox_id)
    assert (await again.commands.run("echo again")).stdout == "again\n"


async def test_foreground_run_streams_and_exit_codes(async_sandbox):
    seen = []
    r = await async_sandbox.commands.run(
        "for i in 1 2 3; do echo line$i; done; echo err >&2", on_stdout=seen.append
    )
    assert (r.exit_code, r.stdout, r.stderr) == (0, "line1\nline2\nline3\n", "err\n")
    assert "".join(seen) == r.stdout
    # Streamed as it happens: the command ends only once the first line was seen here.
    seen_first = asyncio.Event()
    h = await async_sandbox.commands.run(
        "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second",
        background=True,
        on_stdout=lambda line: "first" in line and seen_first.set(),
    )
    await asyncio.wait_for(seen_first.wait(), 60)
    await async_sandbox.files.write("/tmp/go", "")
    assert (await h.wait()).stdout == "first\nsecond\n"
    with pytest.raises(CommandExitException) as e:
        await async_sandbox.commands.run("exit 5")
    assert e.value.exit_code == 5


async def test_env_vars_and_cwd():
    sbx = await AsyncSandbox.create(timeout=60, envs={"FROM_CREATE": "c2"})
    try:
        r = await sbx.commands.run('echo "$FROM_CREATE $X"; pwd', envs={"X": "y"}, cwd="/tmp")
        assert r.stdout == "c2 y\n/tmp\n"
    finally:
        await sbx.kill()


async def test_background_list_connect_stdin_kill(async_sandbox):
    sbx = async_sandbox
    h = await sbx.commands.run("read l; echo got:$l; sleep 600", background=True, stdin=True)
    assert h.pid in [p.pid for p in await sbx.commands.list()]
    got = []
    other = await sbx.commands.connect(h.pid, on_stdout=got.append)
    await sbx.commands.send_stdin(h.pid, "hi\n")
    await until(lambda: "got:hi" in "".join(got), "connected output")
    assert await sbx.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        await h.wait()
    with pytest.raises(CommandExitException):
        await other.wait()
    assert await sbx.commands.kill(999999) is False


async def test_files(async_sandbox):
    fs = async_sandbox.files
    await fs.write("/tmp/a/t.txt", "text")
    assert await fs.read("/tmp/a/t.txt") == "text"
    blob = os.urandom(3 * 1024 * 1024 + 7)
    await fs.write("/tmp/a/b.bin", blob)
    assert bytes(await fs.read("/tmp/a/b.bin", format="bytes")) == blob
    infos = await fs.write_files([{"path": "/tmp/a/x", "data": "1"}, {"path": "/tmp/a/y", "data": b"2"}])
    assert sorted(i.name for i in infos) == ["x", "y"]
    assert await fs.exists("/tmp/a/x") and not await fs.exists("/tmp/a/z")
    info = await fs.get_info("/tmp/a/b.bin")
    assert (info.type, info.size) == (FileType.FILE, len(blob))
    assert await fs.make_dir("/tmp/a/d") is True
    assert await fs.make_dir("/tmp/a/d") is False
    names = sorted(e.name for e in await fs.list("/tmp/a"))
    assert names == ["b.bin", "d", "t.txt", "x", "y"]
    await fs.rename("/tmp/a/x", "/tmp/a/d/x2")
    assert await fs.read("/tmp/a/d/x2") == "1"
    await fs.remove("/tmp/a/d")
    assert not await fs.exists("/tmp/a/d")
    with pytest.raises(NotFoundException):
        await fs.read("/tmp/a/nope")


async def test_watch_dir_stream(async_sandbox):
    await async_sandbox.files.make_dir("/tmp/w")
    events = []
    handle = await async_sandbox.files.watch_dir("/tmp/w", on_event=events.append)
    await async_sandbox.files.write("/tmp/w/n.txt", "x")
    await async_sandbox.files.remove("/tmp/w/n.txt")
    await until(lambda: any(e.type == FilesystemEventType.REMOVE for e in events), f"events {events}")
    assert any(e.name == "n.txt" and e.type == FilesystemEventType.CREATE for e in events)
    await handle.stop()


async def test_pty(async_sandbox):
    out = bytearray()
    term = await async_sandbox.pty.create(PtySize(rows=24, cols=80), on_data=out.extend)
    await until(lambda: b"$ " in out, "the prompt")
    await async_sandbox.pty.send_stdin(term.pid, b"stty size; echo m$((6*7))\n")
    await until(lambda: b"m42" in out, "the first command")
    assert b"24 80" in out
    await async_sandbox.pty.resize(term.pid, PtySize(rows=33, cols=99))
    await async_sandbox.pty.send_stdin(term.pid, b"stty size\n")
    await until(lambda: b"33 99" in out, "the resized terminal")
    assert await async_sandbox.pty.kill(term.pid) is True
    with pytest.raises(CommandExitException):
        await term.wait()
