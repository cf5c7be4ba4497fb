#!/usr/bin/python3
"""bench/bench_live.py - how fast capd serves a polled job, and what 1,000
open event streams cost, each against a reference measured in the same run.

  poll    wrk (64 connections, 2 threads) on GET /v1/jobs/{id} of a finished
          12-cell job, against nginx serving the very same JSON body as a
          static file on the same machine; alternating rounds, medians.
          Figures: requests/s and p99 latency; the ratio capd/nginx
          (target >= 0.5).
  streams the same wrk run on capd while 1,000 GET /v1/events clients are
          held open (heartbeats every --heartbeat-s seconds, 1 by default so
          they are real traffic), against the same run with no streams
          (the idle p99). Figure: p99 with streams / idle p99 (target <= 2),
          plus the heartbeats every client received.

usage: bench_live.py --capd BUILD/capd --fake BUILD/tests/fake_runner
                     [--seconds 10] [--rounds 3] [--streams 1000]
                     [--heartbeat-s 1] [--json FILE]
Needs wrk and nginx (Debian: apt-get install wrk nginx-light); nginx runs
as this user from a private prefix on a free port and is stopped after.
"""
import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def token():
    """The admin token capd wrote at its first start (start_capd puts it in
    the environment, so the streams child process has it too)."""
    return os.environ.get("CAPD_TOKEN", "")


def http(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": "Bearer " + token()}
    if data:
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, r.read()


def start_capd(capd, tmp, streams, heartbeat_s):
    data = os.path.join(tmp, "data")
    cfg = os.path.join(tmp, "capd.json")
    with open(cfg, "w") as f:
        json.dump({"max_connections": streams + 1024, "max_connections_per_ip": streams + 1024,
                   "max_event_streams": streams + 16, "event_heartbeat_s": heartbeat_s,
                   "log_level": "warn", "allowed_hosts": ["bench"]}, f)
    os.chmod(tmp, 0o711)
    p = subprocess.Popen([capd, "--listen", "127.0.0.1:0", "--data-dir", data, "--config", cfg],
                         stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "capd.stderr"), "w"))
    line = p.stdout.readline().decode()
    m = re.search(r"listening on [\d.]+:(\d+)", line)
    if not m:
        raise SystemExit("capd did not start: " + open(os.path.join(tmp, "capd.stderr")).read())
    with open(os.path.join(data, "admin.token")) as f:
        os.environ["CAPD_TOKEN"] = f.read().strip()
    return p, "http://127.0.0.1:%s" % m.group(1)


def seed_job(base, fake, tmp):
    http(base, "POST", "/v1/builds", {"name": "fake", "python": fake, "model_roots": [tmp]})
    st, body = http(base, "POST", "/v1/jobs", {
        "project": "bench", "commit": "abcdef1", "branch": "main", "build": "fake",
        "matrix": {"models": ["fake:ok", "fake:ok__5"], "widths": ["avx2", "default", "native"],
                   "passes": ["forward", "backward"]}})
    job = json.loads(body)["id"]
    for _ in range(600):
        j = json.loads(http(base, "GET", "/v1/jobs/%s?wait=10" % job)[1])
        if j["state"] in ("done", "cancelled"):
            break
    assert len(j["cells"]) == 12, j
    return job


def start_nginx(tmp, path, body):
    root = os.path.join(tmp, "nginx")
    os.makedirs(os.path.join(root, "logs"))
    os.makedirs(os.path.join(root, "html", os.path.dirname(path.lstrip("/"))), exist_ok=True)
    with open(os.path.join(root, "html", path.lstrip("/")), "wb") as f:
        f.write(body)
    port = free_port()
    conf = os.path.join(root, "nginx.conf")
    with open(conf, "w") as f:
        f.write("""
worker_processes auto;
daemon off;
pid %(root)s/nginx.pid;
error_log %(root)s/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %(root)s/tmp_body;
    proxy_temp_path %(root)s/tmp_proxy;
    fastcgi_temp_path %(root)s/tmp_fcgi;
    uwsgi_temp_path %(root)s/tmp_uwsgi;
    scgi_temp_path %(root)s/tmp_scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:%(port)d;
        root %(root)s/html;
        default_type application/json;
        etag on;
    }
}
""" % {"root": root, "port": port})
    p = subprocess.Popen(["nginx", "-p", root, "-c", conf], stderr=subprocess.DEVNULL)
    base = "http://127.0.0.1:%d" % port
    for _ in range(100):
        try:
            http(base, "GET", path)
            return p, base
        except OSError:
            time.sleep(0.05)
    raise SystemExit("nginx did not start")


UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk(url, seconds):
    out = subprocess.run(["wrk", "-t2", "-c64", "-d%ds" % seconds, "--latency",
                          "-H", "Authorization: Bearer " + token(), url],
                         capture_output=True, text=True, check=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    m = re.search(r"^\s+99%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
    p99 = float(m.group(1)) * UNIT[m.group(2)]
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    if non2xx or errors:
        raise SystemExit("wrk saw errors on %s:\n%s" % (url, out))
    return rps, p99


async def hold_streams(port, n, seconds, ready):
    """Opens N event streams, counts the heartbeats each receives."""
    counts = [0] * n
    opened = 0

    async def one(i):
        nonlocal opened
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"GET /v1/events HTTP/1.1\r\nHost: bench\r\nAccept: text/event-stream\r\n"
                b"Authorization: Bearer " + token().encode() + b"\r\n\r\n")
        await w.drain()
        head = await r.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n")[0]:
            raise RuntimeError("stream %d: %r" % (i, head[:80]))
        opened += 1
        if opened == n:
            ready.set()
        end = time.monotonic() + seconds
        buf = b""
        while time.monotonic() < end:
            try:
                chunk = await asyncio.wait_for(r.read(4096), timeout=max(0.1, end - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if not chunk:
                break
            buf += chunk
            counts[i] += buf.count(b": hb\n")
            buf = buf[buf.rfind(b"\n") + 1:]
        w.close()

    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(one(i)))
        if i % 50 == 49:
            await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    return counts


def streams_child(port, n, seconds, outfile):
    """Runs in its own process so its CPU is not wrk's nor capd's thread."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 256)), hard))

    async def main():
        ready = asyncio.Event()

        async def signal_ready():
            await ready.wait()
            with open(outfile + ".ready", "w") as f:
                f.write("1")

        t = asyncio.create_task(signal_ready())
        counts = await hold_streams(port, n, seconds, ready)
        t.cancel()
        return counts

    counts = asyncio.run(main())
    with open(outfile, "w") as f:
        json.dump(counts, f)


def metric(base, name):
    text = http(base, "GET", "/metrics")[1].decode()
    m = re.search(r"^%s (\S+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capd", required=True)
    ap.add_argument("--fake", required=True)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--heartbeat-s", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--streams-child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.streams_child:
        port, n, secs, out = a.streams_child
        streams_child(int(port), int(n), float(secs), out)
        return
    for tool in ("wrk", "nginx"):
        if not shutil.which(tool):
            raise SystemExit("bench_live: %s is missing (apt-get install wrk nginx-light)" % tool)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, a.streams + 4096)), hard))
    tmp = tempfile.mkdtemp(prefix="capd-bench-live-")
    capd = nginx = child = None
    try:
        capd, base = start_capd(a.capd, tmp, a.streams, a.heartbeat_s)
        job = seed_job(base, os.path.abspath(a.fake), tmp)
        path = "/v1/jobs/" + job
        body = http(base, "GET", path)[1]
        nginx, nbase = start_nginx(tmp, path, body)
        assert http(nbase, "GET", path)[1] == body
        print("job %s: %d bytes, 12 cells; wrk -t2 -c64 -d%ds, %d rounds" % (job, len(body), a.seconds, a.rounds))
        capd_r, nginx_r = [], []
        for i in range(a.rounds):
            nginx_r.append(wrk(nbase + path, a.seconds))
            capd_r.append(wrk(base + path, a.seconds))
            print("  round %d: nginx %.0f req/s p99 %.2f ms | capd %.0f req/s p99 %.2f ms"
                  % (i + 1, nginx_r[-1][0], nginx_r[-1][1], capd_r[-1][0], capd_r[-1][1]))
        n_rps = statistics.median(r for r, _ in nginx_r)
        c_rps = statistics.median(r for r, _ in capd_r)
        n_p99 = statistics.median(p for _, p in nginx_r)
        c_p99 = statistics.median(p for _, p in capd_r)

        # The same load with the streams open: idle p99 (just measured) is
        # the reference.
        out = os.path.join(tmp, "streams.json")
        hold = a.seconds * a.rounds + 20
        port = int(base.rsplit(":", 1)[1])
        child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--capd", a.capd,
                                  "--fake", a.fake, "--streams-child", str(port), str(a.streams),
                                  str(hold), out])
        t0 = time.monotonic()
        while not os.path.exists(out + ".ready"):
            if child.poll() is not None or time.monotonic() - t0 > 60:
                raise SystemExit("the stream holder failed to open %d streams" % a.streams)
            time.sleep(0.1)
        open_streams = metric(base, "capd_event_streams")
        threads = len(os.listdir("/proc/%d/task" % capd.pid))
        busy = []
        for i in range(a.rounds):
            busy.append(wrk(base + path, a.seconds))
            print("  round %d with %d streams: capd %.0f req/s p99 %.2f ms"
                  % (i + 1, a.streams, busy[-1][0], busy[-1][1]))
        b_rps = statistics.median(r for r, _ in busy)
        b_p99 = statistics.median(p for _, p in busy)
        child.wait(timeout=hold + 60)
        child = None
        counts = json.load(open(out))
        result = {
            "job_bytes": len(body),
            "nginx_rps": n_rps, "nginx_p99_ms": n_p99,
            "capd_rps": c_rps, "capd_p99_ms": c_p99,
            "capd_over_nginx_rps": c_rps / n_rps,
            "streams": a.streams, "streams_open_per_metrics": open_streams,
            "heartbeat_s": a.heartbeat_s, "capd_threads_with_streams": threads,
            "heartbeats_min": min(counts), "heartbeats_median": statistics.median(counts),
            "capd_rps_with_streams": b_rps, "capd_p99_ms_with_streams": b_p99,
            "p99_with_streams_over_idle": b_p99 / c_p99,
            "rounds": a.rounds, "seconds": a.seconds,
        }
        print("GET /v1/jobs/{id}: capd %.0f req/s vs nginx %.0f req/s on the same body: ratio %.2f "
              "(target >= 0.5); p99 %.2f ms vs %.2f ms"
              % (c_rps, n_rps, c_rps / n_rps, c_p99, n_p99))
        print("%d open event streams (capd counts %s, %d threads; every client got >= %d heartbeats "
              "in %d s): p99 %.2f ms vs idle %.2f ms: ratio %.2f (target <= 2); %.0f req/s"
              % (a.streams, open_streams, threads, min(counts), hold, b_p99, c_p99, b_p99 / c_p99, b_rps))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
    finally:
        if child:
            child.kill()
        if nginx:
            nginx.send_signal(signal.SIGQUIT)
            nginx.wait(timeout=20)
        if capd:
            capd.send_signal(signal.SIGTERM)
            capd.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
