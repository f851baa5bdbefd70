"""The official E2B SDK's synchronous client against a sandboxd node (process engine,
`default` template aliased as E2B's `base`). Each test names the SDK calls it covers."""

import os
import threading
import time
import uuid

import pytest
from e2b import (
    CommandExitException,
    FileType,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxQuery,
)


def test_create_info_kill():
    sbx = Sandbox.create(timeout=60, metadata={"suite": "sync"})
    try:
        assert sbx.is_running()
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata == {"suite": "sync"}
        assert info.template_id == "base"
    finally:
        assert sbx.kill() is True
    assert not sbx.is_running()
    # Killing again: the SDK reads 404 as False.
    assert Sandbox.kill(sbx.sandbox_id) is False


def test_list_with_metadata_filter_and_timeout():
    tag = uuid.uuid4().hex
    a = Sandbox.create(timeout=60, metadata={"run": tag, "role": "a"})
    b = Sandbox.create(timeout=60, metadata={"run": tag, "role": "b"})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"run": tag})).next_items()
        assert sorted(s.sandbox_id for s in found) == sorted([a.sandbox_id, b.sandbox_id])
        only_b = Sandbox.list(query=SandboxQuery(metadata={"run": tag, "role": "b"})).next_items()
        assert [s.sandbox_id for s in only_b] == [b.sandbox_id]
        assert only_b[0].metadata["role"] == "b"
        # Paging: one per page, the next token leads to the other.
        pages = Sandbox.list(query=SandboxQuery(metadata={"run": tag}), limit=1)
        first = pages.next_items()
        assert len(first) == 1 and pages.has_next
        second = pages.next_items()
        assert {first[0].sandbox_id, second[0].sandbox_id} == {a.sandbox_id, b.sandbox_id}
        # Timeout = TTL: the end moves with set_timeout.
        before = a.get_info().end_at
        a.set_timeout(100)
        assert a.get_info().end_at > before
    finally:
        a.kill()
        b.kill()


def test_short_timeout_ends_the_sandbox():
    sbx = Sandbox.create(timeout=2)
    deadline = time.monotonic() + 60
    while sbx.is_running():
        assert time.monotonic() < deadline, "the sandbox outlived its timeout"
        time.sleep(0.2)
    with pytest.raises(NotFoundException):
        sbx.get_info()


def test_pause_is_refused_clearly(sandbox):
    with pytest.raises(SandboxException) as e:
        sandbox.pause()
    assert "501" in str(e.value) and "hibernate" in str(e.value)
    assert sandbox.is_running()


def test_connect_to_a_running_sandbox(sandbox):
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.commands.run("echo again").stdout == "again\n"
    with pytest.raises(NotFoundException):
        Sandbox.connect("no-such-sandbox")


def test_foreground_run_streams_and_exit_codes(sandbox):
    seen = []
    r = sandbox.commands.run(
        "for i in 1 2 3; do echo line$i; done; echo err >&2",
        on_stdout=lambda s: seen.append(s),
    )
    assert r.exit_code == 0
    assert r.stdout == "line1\nline2\nline3\n"
    assert r.stderr == "err\n"
    assert "".join(seen) == r.stdout
    # Each event arrives as it happens: the command waits for a file the callback only
    # writes once it has seen the first line (buffered output would never get there).
    def on_line(line):
        if "first" in line:
            sandbox.files.write("/tmp/go", "")

    r = sandbox.commands.run(
        "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second",
        on_stdout=on_line,
        timeout=60,
    )
    assert r.stdout == "first\nsecond\n"
    with pytest.raises(CommandExitException) as e:
        sandbox.commands.run("echo out; exit 3")
    assert e.value.exit_code == 3
    assert e.value.stdout == "out\n"


def test_env_vars_and_cwd():
    sbx = Sandbox.create(timeout=60, envs={"FROM_CREATE": "c1"})
    try:
        r = sbx.commands.run(
            'echo "$FROM_CREATE $FROM_RUN"; pwd', envs={"FROM_RUN": "r1"}, cwd="/tmp"
        )
        assert r.stdout == "c1 r1\n/tmp\n"
        assert sbx.commands.run("whoami").stdout == "user\n"
        # `user=` (sent as Basic auth) picks who runs and who writes.
        assert sbx.commands.run("whoami", user="root").stdout == "root\n"
        sbx.files.write("/root/only-root.txt", "r", user="root")
        assert sbx.files.read("/root/only-root.txt", user="root") == "r"
        assert sbx.commands.run("stat -c %U /root/only-root.txt", user="root").stdout == "root\n"
    finally:
        sbx.kill()


def test_background_list_connect_stdin_kill(sandbox):
    h = sandbox.commands.run("read line; echo got:$line; sleep 600", background=True, stdin=True)
    pids = [p.pid for p in sandbox.commands.list()]
    assert h.pid in pids
    listed = next(p for p in sandbox.commands.list() if p.pid == h.pid)
    assert listed.cmd == "/bin/bash"
    sandbox.commands.send_stdin(h.pid, "hello\n")
    other = sandbox.commands.connect(h.pid)
    got = []
    done = threading.Event()

    def follow():
        try:
            other.wait(on_stdout=lambda s: (got.append(s), "got:hello" in "".join(got) and done.set()))
        except CommandExitException:
            pass

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    assert done.wait(60), f"connected handle saw {got!r}"
    assert sandbox.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException) as e:
        h.wait()
    assert e.value.exit_code != 0
    t.join(60)
    assert h.pid not in [p.pid for p in sandbox.commands.list()]
    assert sandbox.commands.kill(999999) is False


def test_files_round_trips(sandbox):
    fs = sandbox.files
    fs.write("/tmp/t/a.txt", "hello")
    assert fs.read("/tmp/t/a.txt") == "hello"
    blob = os.urandom(256 * 1024) + bytes(range(256))
    fs.write("/tmp/t/b.bin", blob)
    assert bytes(fs.read("/tmp/t/b.bin", format="bytes")) == blob
    infos = fs.write_files(
        [{"path": "/tmp/t/m1", "data": "one"}, {"path": "/tmp/t/sub/m2", "data": b"\x00two"}]
    )
    assert sorted(i.path for i in infos) == ["/tmp/t/m1", "/tmp/t/sub/m2"]
    assert bytes(fs.read("/tmp/t/sub/m2", format="bytes")) == b"\x00two"
    large = os.urandom(24 * 1024 * 1024)
    fs.write("/tmp/t/large", large)
    assert bytes(fs.read("/tmp/t/large", format="bytes")) == large
    # A relative path is from the user's home.
    fs.write("rel.txt", "home")
    assert sandbox.commands.run("cat ~/rel.txt").stdout == "home"
    with pytest.raises(NotFoundException):
        fs.read("/tmp/t/missing")


def test_files_metadata_and_tree(sandbox):
    fs = sandbox.files
    fs.write("/tmp/d/f.txt", "12345")
    assert fs.exists("/tmp/d/f.txt")
    assert not fs.exists("/tmp/d/nope")
    info = fs.get_info("/tmp/d/f.txt")
    assert (info.name, info.type, info.size, info.path) == ("f.txt", FileType.FILE, 5, "/tmp/d/f.txt")
    assert info.permissions.startswith("-rw")
    assert fs.make_dir("/tmp/d/sub/deeper") is True
    assert fs.make_dir("/tmp/d/sub/deeper") is False
    names = sorted((e.name, e.type) for e in fs.list("/tmp/d"))
    assert names == [("f.txt", FileType.FILE), ("sub", FileType.DIR)]
    moved = fs.rename("/tmp/d/f.txt", "/tmp/d/sub/g.txt")
    assert moved.path == "/tmp/d/sub/g.txt"
    assert fs.read("/tmp/d/sub/g.txt") == "12345"
    fs.remove("/tmp/d/sub")
    assert not fs.exists("/tmp/d/sub")
    with pytest.raises(NotFoundException):
        fs.get_info("/tmp/d/sub")


def test_watch_dir(sandbox):
    sandbox.files.make_dir("/tmp/w")
    handle = sandbox.files.watch_dir("/tmp/w")
    sandbox.files.write("/tmp/w/new.txt", "x")
    sandbox.commands.run("rm /tmp/w/new.txt")
    seen = []
    deadline = time.monotonic() + 60
    while not any(e.type == FilesystemEventType.REMOVE for e in seen):
        assert time.monotonic() < deadline, f"events so far: {seen}"
        seen += handle.get_new_events()
        time.sleep(0.1)
    assert any(e.name == "new.txt" and e.type == FilesystemEventType.CREATE for e in seen)
    handle.stop()


def test_pty_create_input_resize_kill(sandbox):
    out = bytearray()
    seen = threading.Condition()
    term = sandbox.pty.create(PtySize(rows=24, cols=80))

    def follow():
        def on_pty(d):
            with seen:
                out.extend(d)
                seen.notify_all()

        try:
            term.wait(on_pty=on_pty)
        except CommandExitException:
            pass

    def wait_for(text):
        with seen:
            assert seen.wait_for(lambda: text in out, 60), repr(bytes(out))

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    # Type only once the shell prompts: interactive bash can drop type-ahead.
    wait_for(b"$ ")
    sandbox.pty.send_stdin(term.pid, b"stty size; echo mark$((6*7))\n")
    wait_for(b"mark42")
    assert b"24 80" in out
    sandbox.pty.resize(term.pid, PtySize(rows=40, cols=100))
    sandbox.pty.send_stdin(term.pid, b"stty size\n")
    wait_for(b"40 100")
    # A second client connects to the same terminal and sees its output as pty data.
    again = bytearray()
    joined = sandbox.pty.connect(term.pid)
    t2 = threading.Thread(
        target=lambda: pytest.raises(CommandExitException, joined.wait, on_pty=again.extend),
        daemon=True,
    )
    t2.start()
    sandbox.pty.send_stdin(term.pid, b"echo via$((1+1))connect\n")
    wait_for(b"via2connect")
    assert sandbox.pty.kill(term.pid) is True
    t2.join(60)
    assert b"via2connect" in again
    t.join(60)
    assert not t.is_alive()


def test_hostile_and_wrong_credentials(sandbox):
    import httpx

    url = os.environ["E2B_SANDBOX_URL"]
    sid = sandbox.sandbox_id
    with httpx.Client(base_url=url) as c:
        head = {"E2b-Sandbox-Id": sid, "X-Access-Token": "wrong"}
        r = c.post("/filesystem.Filesystem/Stat", json={"path": "/"}, headers=head)
        assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
        r = c.get("/files", params={"path": "/etc/hostname"}, headers={"E2b-Sandbox-Id": sid})
        assert r.status_code == 401 and r.json()["code"] == 401
        r = c.post("/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": "nope"})
        assert r.status_code == 401 and r.json()["code"] == 401
        r = c.get("/sandboxes/nope", headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
        assert r.status_code == 404 and r.json()["code"] == 404
        # Another tenant sees nothing of this sandbox, and cannot kill it.
        other = {"X-API-KEY": os.environ["E2B_TEST_OTHER_KEY"]}
        assert c.get(f"/sandboxes/{sid}", headers=other).status_code == 404
        assert c.delete(f"/sandboxes/{sid}", headers=other).status_code == 404
        assert sid not in [s["sandboxID"] for s in c.get("/v2/sandboxes", headers=other).json()]
        # Another sandbox's access token opens nothing here.
        second = Sandbox.create(timeout=30)
        try:
            head = {"E2b-Sandbox-Id": sid, "X-Access-Token": second._envd_access_token}
            r = c.post("/filesystem.Filesystem/Stat", json={"path": "/"}, headers=head)
            assert r.status_code == 401, r.text
        finally:
            second.kill()
        r = c.post(
            "/v2/sandboxes",
            json={"templateID": "no-such-template"},
            headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
        )
        assert r.status_code == 400 and r.json()["code"] == 400
        r = c.post(
            "/v2/sandboxes",
            json={"templateID": "base", "allow_internet_access": True},
            headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
        )
        assert r.status_code == 501, r.text
        key = {"X-API-KEY": os.environ["E2B_API_KEY"]}
        r = c.post("/v2/sandboxes", content=b"[]", headers=key)
        assert r.status_code == 400 and r.json()["code"] == 400
        # Refused before it is all read, so the connection closes after the answer.
        with httpx.Client(base_url=url) as once:
            big = b"{" + b" " * (2 << 20) + b"}"
            r = once.post("/v2/sandboxes", content=big, headers=key)
        assert r.status_code == 413 and r.json()["code"] == 413
        r = c.post("/sandboxes/nope/pause", headers=key)
        assert r.status_code == 404 and r.json()["code"] == 404
    # Through the SDK's own agent client: real token, hostile bodies.
    envd = sandbox._envd_api
    bad = [
        (b"\x00\xff\xff\xff\xff", "invalid_argument"),  # a 4 GiB length
        (b"\x01\x00\x00\x00\x02{}", "invalid_argument"),  # compressed flag
        (b"\x00\x00\x00\x00\x05{\"pr", "invalid_argument"),  # cut short
        (b"\x00\x00\x00\x00\x02[]", "invalid_argument"),  # not an object
    ]
    for body, code in bad:
        r = envd.post(
            "/process.Process/Start",
            content=body,
            headers={"Content-Type": "application/connect+json", "E2b-Sandbox-Id": sid},
        )
        assert r.status_code == 200, r.text
        assert r.content[0] == 2, r.content
        assert f'"code":"{code}"' in r.content[5:].decode(), r.content
    r = envd.post(
        "/process.Process/SendInput",
        json={"process": {"pid": 1}, "input": {"stdin": "!!not base64!!"}},
        headers={"E2b-Sandbox-Id": sid},
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    for path in ["../../etc/shadow", "/proc/1/root/etc/shadow"]:
        r = envd.get("/files", params={"path": path}, headers={"E2b-Sandbox-Id": sid})
        assert r.status_code in (403, 404), (path, r.status_code, r.content[:100])
    r = envd.post(
        "/files",
        content=b"--xx\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\ndata\r\n--xx--\r\n",
        headers={"Content-Type": "multipart/form-data; boundary=xx", "E2b-Sandbox-Id": sid},
    )
    assert r.status_code == 400 and r.json()["code"] == 400
    r = envd.post(
        "/files",
        content=b"x" * (4 << 20),
        headers={"Content-Type": "multipart/form-data; boundary=never", "E2b-Sandbox-Id": sid},
    )
    assert r.status_code == 400 and "closing delimiter" in r.json()["message"]
    r = envd.post(
        "/process.Process/SendSignal",
        json={"process": {"pid": 1}, "signal": "SIGNAL_SIGSTOP"},
        headers={"E2b-Sandbox-Id": sid},
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    start = b'{"process":{"cmd":"true"},"pty":{"size":{"rows":0,"cols":80}}}'
    r = envd.post(
        "/process.Process/Start",
        content=bytes([0]) + len(start).to_bytes(4, "big") + start,
        headers={"Content-Type": "application/connect+json", "E2b-Sandbox-Id": sid},
    )
    assert r.content[0] == 2 and b"invalid_argument" in r.content, r.content
    # Polled watchers are bounded per sandbox; stopping them frees their places.
    handles = [sandbox.files.watch_dir("/tmp") for _ in range(32)]
    with pytest.raises(SandboxException):
        sandbox.files.watch_dir("/tmp")
    for h in handles:
        h.stop()
    sandbox.files.watch_dir("/tmp").stop()
    assert sandbox.commands.run("echo still fine").stdout == "still fine\n"
