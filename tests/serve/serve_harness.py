"""Starts `slim serve` for the server tests on free loopback ports and stops it.

    with start_server(repo, ["--threads", "2"]) as srv:
        srv.http_port, srv.grpc_port, srv.metrics_port, srv.proc

The binary is SLIM_BINARY_DIR/tools/slim; SLIM_TEST_RUNNER (an emulator command line)
is put in front of it when set. The server binds port 0 for each front door and prints
the ports it bound, then "slim serve: ready"; stop() sends SIGTERM and returns the exit
code, which a clean drain makes 0.
"""
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

PORT_LINE = re.compile(r"^slim serve: (HTTP|gRPC|metrics) listening on ([0-9.]+):(\d+)$")


def slim_binary():
    build = os.environ.get("SLIM_BINARY_DIR")
    if not build:
        raise RuntimeError("SLIM_BINARY_DIR is not set (ctest sets it to the build folder)")
    return os.path.join(build, "tools", "slim")


def slim_command(*args):
    """The command line that runs slim with ARGS: SLIM_TEST_RUNNER (a cross build's
    emulator, an emulated CPU) first when set."""
    return shlex.split(os.environ.get("SLIM_TEST_RUNNER", "")) + [slim_binary()] + list(args)


class Server:
    def __init__(self, args, env=None, ready_timeout=120, prefix=()):
        self.args = list(prefix) + slim_command("serve", *args)
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.http_port = self.grpc_port = self.metrics_port = None
        self.stdout_lines = []
        self.stderr_lines = []
        self._err_thread = threading.Thread(target=self._drain, args=(self.proc.stderr, self.stderr_lines),
                                            daemon=True)
        self._err_thread.start()
        deadline = time.monotonic() + ready_timeout
        ready = False
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            line = line.rstrip("\n")
            self.stdout_lines.append(line)
            m = PORT_LINE.match(line)
            if m:
                port = int(m.group(3))
                if m.group(1) == "HTTP":
                    self.http_port = port
                elif m.group(1) == "gRPC":
                    self.grpc_port = port
                else:
                    self.metrics_port = port
            if line == "slim serve: ready":
                ready = True
                break
        if not ready:
            self.proc.kill()
            self.proc.wait()
            self._err_thread.join(5)
            raise RuntimeError("slim serve did not become ready:\nstdout:\n" + "\n".join(self.stdout_lines) +
                               "\nstderr:\n" + "\n".join(self.stderr_lines))
        self._out_thread = threading.Thread(target=self._drain, args=(self.proc.stdout, self.stdout_lines),
                                            daemon=True)
        self._out_thread.start()

    @staticmethod
    def _drain(stream, lines):
        for line in stream:
            lines.append(line.rstrip("\n"))

    def url(self, path=""):
        return f"http://127.0.0.1:{self.http_port}{path}"

    def stop(self, timeout=60):
        """SIGTERM, wait for the drain, return the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError("slim serve did not exit within %d s of SIGTERM" % timeout)
        self._err_thread.join(5)
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_server(repo, extra_args=(), env=None, prefix=()):
    """`prefix`: a command the server runs under (tests/serve/cgroup_run.sh LIMIT)."""
    args = ["--model-repository", repo, "--host", "127.0.0.1", "--http-port", "0",
            "--grpc-port", "0", "--metrics-port", "0"] + list(extra_args)
    return Server(args, env=env, prefix=prefix)


def request(srv, path, body=None, timeout=30):
    """GET (or POST `body` as JSON) on the server's HTTP port: (status, parsed JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(srv.url(path), data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def wait_for(cond, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


def audit_events(log, model=None):
    """The records of an audit log (`slim audit show --json`), of one model when given."""
    args = ["audit", "show", log, "--json"] + (["--model", model] if model else [])
    p = subprocess.run(slim_command(*args), capture_output=True, text=True, check=True)
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


@contextlib.contextmanager
def clients(call, n=4):
    """`n` threads calling `call()` again and again while the block runs; yields the set of
    what the calls returned and the list of what they raised, complete once the block ends."""
    stop, seen, failures = threading.Event(), set(), []

    def loop():
        while not stop.is_set():
            try:
                seen.add(call())
            except Exception as e:  # noqa: BLE001
                failures.append(str(e))

    threads = [threading.Thread(target=loop) for _ in range(n)]
    for t in threads:
        t.start()
    try:
        yield seen, failures
    finally:
        stop.set()
        for t in threads:
            t.join()
