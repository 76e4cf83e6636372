"""tests/serve/cgroup_run.sh: a command runs under a memory limit in a fresh cgroup, is
OOM-killed past it, gets SIGTERM passed on, and the cgroup is removed afterwards. Lowering
the limit below the usage OOM-kills under cgroup v2 and is refused (EBUSY) under v1.
Exits 77 (skipped) where the machine gives no cgroup with a memory controller."""
import errno
import os
import signal
import subprocess
import sys
import tempfile

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cgroup_run.sh")
MiB = 1 << 20


def read_info(path):
    with open(path) as f:
        return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)


def start(limit, code, info):
    return subprocess.Popen(["bash", SCRIPT, "--info", info, str(limit), sys.executable, "-c", code],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def main():
    tmp = tempfile.mkdtemp(prefix="cgroup_run_")
    info = os.path.join(tmp, "info")

    # Within the limit: the command's own exit status, no OOM kill.
    p = start(64 * MiB, "b = b'x' * (16 << 20); print('ok')", info)
    out, err = p.communicate(timeout=60)
    if p.returncode == 77:
        print("skipped:", err.strip())
        return 77
    assert p.returncode == 0 and out == "ok\n", (p.returncode, out, err)
    i = read_info(info)
    assert i["version"] in ("1", "2") and i["oom_kill"] == "0", i
    assert not os.path.exists(i["dir"]), "cgroup left behind: " + i["dir"]
    print("cgroup v%s under %s" % (i["version"], os.path.dirname(i["dir"])))

    # Past the limit: OOM-killed (137), and the info says so.
    p = start(64 * MiB, "b = b'x' * (256 << 20); print('survived')", info)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 137 and out == "", (p.returncode, out, err)
    assert read_info(info)["oom_kill"] == "1", read_info(info)
    assert "the kernel OOM-killed 1 process(es)" in err, err

    # SIGTERM reaches the command (exit 143) and the cgroup is removed.
    p = start(64 * MiB, "import time; print('up', flush=True); time.sleep(60)", info)
    assert p.stdout.readline() == "up\n"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 143
    assert not os.path.exists(read_info(info)["dir"])

    # Lowering the limit below what the command uses.
    p = start(256 * MiB, "import time; b = b'x' * (96 << 20); print('up', flush=True); time.sleep(60)", info)
    assert p.stdout.readline() == "up\n"
    i = read_info(info)
    try:
        with open(i["limit_file"], "w") as f:
            f.write(str(32 * MiB))
        refused = None
    except OSError as e:
        refused = e.errno
    if i["version"] == "2":
        assert refused is None, refused
        assert p.wait(timeout=30) == 137
        assert read_info(info)["oom_kill"] == "1"
    else:
        assert refused == errno.EBUSY, refused
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=30) == 143
    p.communicate()
    print("lowering the limit below the usage:", "OOM kill" if i["version"] == "2" else "refused (EBUSY)")
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
