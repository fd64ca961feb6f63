"""Integration tests of kilnd against a real daemon on a temporary socket
(issue 6, "Tests"): every op and every error code, bad frames and garbage,
misbehaving clients, single flight across 64 clients, restarts, kill -9,
SIGTERM drain, systemd notify and socket activation, TCP, SIGHUP reload and
the idle timeout.

Helpers and fixtures live in this directory's conftest.py.
"""

import importlib.util
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import msgpack
import pytest


def _conftest():
    # pytest has loaded this directory's conftest.py already; find it by
    # path (another directory's conftest may also be called "conftest").
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conftest.py")
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if f and os.path.abspath(f) == here:
            return m
    spec = importlib.util.spec_from_file_location("kilnd_it_conftest", here)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


_c = _conftest()
Client, Closed, CPU = _c.Client, _c.Closed, _c.CPU
compile_msg, err, frame, graph, ok = _c.compile_msg, _c.err, _c.frame, _c.graph, _c.ok
pack, unpack, variant, wait_for = _c.pack, _c.unpack, _c.variant, _c.wait_for

HEX = set("0123456789abcdef")

ARTIFACT_FIELDS = {
    "format", "target", "signature", "code", "cubin", "symbols", "bindings",
    "inputs", "kernels", "buffers", "views", "steps", "outputs",
    "n_out_buffers", "arena_bytes", "kernels_text",
}

# The settings of daemon/config.h every kilnd has (more may be added).
SETTINGS = {
    "socket", "tcp_listen", "store_dir", "store_max_bytes",
    "store_min_free_bytes", "hot_bytes", "workers", "queue_depth",
    "compile_timeout_s", "max_connections", "max_frame_bytes", "max_nodes",
    "max_inflight", "max_pending_write_bytes", "idle_timeout_s",
    "drain_timeout_s", "admin_group", "log_level",
}


def check_config_settings(d):
    """{name: value} as `kilnd --check-config` prints it for d's settings."""
    p = subprocess.run([d.command()[0], "--check-config"] + d.command()[1:],
                       capture_output=True, text=True, timeout=30, env=d.environ())
    assert p.returncode == 0, p.stderr
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("#") or "=" not in line:
            continue
        name, rest = line.split("=", 1)
        out[name.strip()] = rest.split("#", 1)[0].strip()
    return out


OPS = {"hello", "compile", "lookup", "status", "list", "evict", "gc", "shutdown"}


def is_sig(s):
    return isinstance(s, str) and len(s) == 64 and set(s) <= HEX


def check_artifact_reply(r, sources=None):
    """A compile/lookup success whose artifact decodes as a kiln.artifact/1
    map for the reply's signature; returns the artifact's bytes."""
    ok(r)
    assert is_sig(r["signature"]), r
    if sources is not None:
        assert r["source"] in sources, (r["source"], sources)
    assert isinstance(r["compile_ms"], float) and r["compile_ms"] >= 0
    blob = r["artifact"]
    assert isinstance(blob, bytes) and blob
    a = msgpack.unpackb(blob, raw=False)
    assert isinstance(a, dict)
    assert ARTIFACT_FIELDS <= set(a), ARTIFACT_FIELDS - set(a)
    assert a["format"] == "kiln.artifact/1"
    assert a["target"]["backend"] == "cpu"
    assert a["signature"] == r["signature"]
    assert isinstance(a["code"], bytes) and a["code"][:4] == b"\x7fELF"
    for k in ("inputs", "kernels", "buffers", "views", "steps", "outputs", "bindings"):
        assert isinstance(a[k], list), k
    assert isinstance(a["n_out_buffers"], int)
    return blob


def compile_(c, g, **extra):
    return c.wait(c.send(compile_msg(g, **extra)))


def list_entries(d, **fields):
    with d.client() as c:
        return ok(c.request("list", **fields))["entries"]


# ---- ops ---------------------------------------------------------------------


def test_hello(kilnd):
    with kilnd.client() as c:
        r = ok(c.request("hello", client="kiln-it/1", pid=os.getpid()))
    assert r["id"] == 1
    assert r["server"] == "kilnd"
    assert r["version"] == "0.1.0"
    assert r["protocol"] == 1
    assert isinstance(r["fingerprint"], str) and r["fingerprint"].startswith("kiln/0.1.0")
    assert isinstance(r["targets"], list) and r["targets"]
    cpu = [t for t in r["targets"] if t["backend"] == "cpu"]
    assert len(cpu) == 1
    assert isinstance(cpu[0]["arch"], str) and cpu[0]["arch"]
    assert isinstance(cpu[0]["features"], str)
    assert r["limits"] == {"max_frame_bytes": 64 << 20, "max_nodes": 100000,
                           "max_inflight": 64}
    # The socket is created 0660 in a 0750 directory.
    assert os.stat(kilnd.socket_path).st_mode & 0o777 == 0o660
    assert os.stat(os.path.dirname(kilnd.socket_path)).st_mode & 0o777 == 0o750


def test_second_kilnd_on_a_live_socket_fails(make_kilnd, workdir):
    d = make_kilnd()
    d2 = make_kilnd(store_dir=os.path.join(workdir, "store2"), start=False)
    d2.start(wait=False)
    assert d2.wait_exit(30) not in (None, 0)
    assert "another kilnd" in d2.read_log()
    with d.client() as c:  # the first one is untouched
        ok(c.request("hello"))


def test_hello_reports_configured_limits(make_kilnd):
    d = make_kilnd(args=["--max-frame-bytes", "1M", "--max-nodes", "5000",
                         "--max-inflight", "7"])
    with d.client() as c:
        r = ok(c.request("hello"))
    assert r["limits"] == {"max_frame_bytes": 1 << 20, "max_nodes": 5000,
                           "max_inflight": 7}


def test_compile_then_memory(kilnd):
    with kilnd.client() as c:
        r1 = compile_(c, graph("mlp_fwd"), options={"mode": "default", "dynamic": None},
                      priority="interactive")
        a1 = check_artifact_reply(r1, {"compiled"})
        assert r1["compile_ms"] > 0
        r2 = compile_(c, graph("mlp_fwd"))
        a2 = check_artifact_reply(r2, {"memory"})
        # Another connection, unknown keys, batch priority: still a hit.
        with kilnd.client() as c2:
            r3 = compile_(c2, graph("mlp_fwd"), priority="batch", extra_key=[1, 2])
            a3 = check_artifact_reply(r3, {"memory"})
    assert r1["signature"] == r2["signature"] == r3["signature"]
    assert a1 == a2 == a3
    st = kilnd.stats()
    assert st["compiled"] == 1
    assert st["hits"]["memory"] == 2
    assert st["requests"]["compile"] == 3


def test_compile_options_change_signature(kilnd):
    with kilnd.client() as c:
        r1 = compile_(c, graph("mlp_fwd"))
        r2 = compile_(c, graph("mlp_fwd"), options={"mode": "max-autotune"})
        check_artifact_reply(r1, {"compiled"})
        check_artifact_reply(r2, {"compiled"})
        assert r1["signature"] != r2["signature"]
        # dynamic is not part of the signature.
        r3 = compile_(c, graph("mlp_fwd"), options={"dynamic": False})
        check_artifact_reply(r3, {"memory"})
        assert r3["signature"] == r1["signature"]


def test_lookup_memory_disk_not_found_bad(make_kilnd):
    d = make_kilnd(args=["--workers", "1"])
    with d.client() as c:
        r = compile_(c, graph("mlp_fwd"))
        art = check_artifact_reply(r, {"compiled"})
        sig = r["signature"]
        lr = c.request("lookup", signature=sig)
        assert check_artifact_reply(lr, {"memory"}) == art
        assert lr["signature"] == sig
    assert d.stop() == 0
    d.start()
    with d.client() as c:
        lr = c.request("lookup", signature=sig)
        assert check_artifact_reply(lr, {"disk"}) == art
        lr = c.request("lookup", signature=sig)
        assert check_artifact_reply(lr, {"memory"}) == art
        err(c.request("lookup", signature="0" * 64), "not_found")
        err(c.request("lookup", signature="ab" * 31), "bad_request")  # 62 chars
        err(c.request("lookup", signature="g" * 64), "bad_request")
        err(c.request("lookup", signature=sig + "00"), "bad_request")
        err(c.request("lookup", signature=12345), "bad_request")
        err(c.request("lookup"), "bad_request")
        ok(c.request("hello"))  # the connection is still usable
    st = d.stats()
    assert st["hits"]["disk"] == 1 and st["hits"]["memory"] == 1
    assert "not_found" not in st["errors"]  # a miss, not an error
    assert st["lookup_misses"] == 1
    assert st["errors"].get("bad_request") == 5


def test_status(kilnd):
    with kilnd.client() as c:
        check_artifact_reply(compile_(c, graph("mlp_fwd")), {"compiled"})
        err(c.request("lookup", signature="1" * 64), "not_found")
        r = ok(c.request("status"))
        assert set(r) >= {"stats"} and "settings" not in r
        st = r["stats"]
        assert {"uptime_s", "rss_bytes", "connections", "requests", "hits",
                "compiled", "joined", "failed", "timeouts", "busy", "bad_frames",
                "read_paused", "store_put_errors", "dynamic", "queue", "workers",
                "compile_ms", "hot", "store", "errors"} <= set(st)
        assert st["uptime_s"] >= 0 and st["rss_bytes"] > 0
        assert set(st["connections"]) >= {"current", "total", "rejected", "idle_closed"}
        assert st["connections"]["current"] == 1
        assert set(st["requests"]) == OPS
        assert st["requests"]["compile"] == 1 and st["requests"]["lookup"] == 1
        assert st["requests"]["status"] == 1
        assert set(st["hits"]) == {"memory", "disk", "remote"}
        assert st["compiled"] == 1
        assert st["workers"]["busy"] == 0 and st["workers"]["total"] == 2
        assert set(st["queue"]) >= {"depth", "max", "in_flight"}
        assert st["queue"]["max"] == 256
        assert set(st["compile_ms"]) == {"p50", "p90", "p99"}
        assert st["compile_ms"]["p50"] > 0
        assert st["hot"]["entries"] == 1 and st["hot"]["bytes"] > 0
        assert st["store"]["entries"] == 1 and st["store"]["bytes"] > 0
        assert st["errors"] == {}
        assert st["lookup_misses"] == 1

        r = ok(c.request("status", settings=True))
        s = r["settings"]
        # Every setting, with the value --check-config reports.
        assert SETTINGS <= set(s)
        assert s == check_config_settings(kilnd)
        assert s["workers"] == "2"
        assert s["socket"] == kilnd.socket_path
        assert s["store_dir"] == kilnd.store_dir
        assert s["queue_depth"] == "256"
        assert s["max_inflight"] == "64"
        assert s["log_level"] == "debug"


def _three_entries(d):
    """Compiles three graphs of distinct sizes; returns {sig: artifact}."""
    out = {}
    with d.client() as c:
        ids = [c.send(compile_msg(graph(n)))
               for n in ("mlp_fwd", "cnn_fwd", "transformer_layer_fwd")]
        for i in ids:
            r = c.wait(i)
            out[r["signature"]] = check_artifact_reply(r, {"compiled"})
    assert len(out) == 3
    return out


def test_list(kilnd):
    arts = _three_entries(kilnd)
    with kilnd.client() as c:
        es = ok(c.request("list"))["entries"]
        assert {e["signature"] for e in es} == set(arts)
        now = time.time()
        for e in es:
            assert set(e) == {"signature", "size", "target", "created",
                              "last_used", "hits", "compile_ms", "source"}
            assert e["size"] == len(arts[e["signature"]])
            assert e["target"] == "cpu"
            assert e["source"] == "compiled"
            assert now - 120 <= e["created"] <= now + 5
            assert e["created"] <= e["last_used"] <= now + 5
            assert isinstance(e["hits"], int) and isinstance(e["compile_ms"], int)
        by_size = ok(c.request("list", order="size"))["entries"]
        sizes = [e["size"] for e in by_size]
        assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3
        top = ok(c.request("list", order="size", limit=1))["entries"]
        assert [e["signature"] for e in top] == [by_size[0]["signature"]]
        assert len(ok(c.request("list", limit=2))["entries"]) == 2
        hits = [e["hits"] for e in ok(c.request("list", order="hits"))["entries"]]
        assert hits == sorted(hits, reverse=True)
        created = [e["created"] for e in ok(c.request("list", order="created"))["entries"]]
        assert created == sorted(created, reverse=True)
        lru = [e["last_used"] for e in ok(c.request("list", order="last_used"))["entries"]]
        assert len(lru) == 3 and (lru == sorted(lru) or lru == sorted(lru, reverse=True))
        assert len(ok(c.request("list", target="cpu"))["entries"]) == 3
        assert ok(c.request("list", target="cuda"))["entries"] == []
        err(c.request("list", order="biggest"), "bad_request")
        err(c.request("list", order=3), "bad_request")
        err(c.request("list", limit="ten"), "bad_request")
        err(c.request("list", limit=-1), "bad_request")
        err(c.request("list", target=7), "bad_request")
        ok(c.request("list"))


def test_list_limit_zero(kilnd):
    # "limit: at most this many entries": 0 means none (or is refused),
    # never "all of them".
    _three_entries_fast(kilnd)
    with kilnd.client() as c:
        r = c.request("list", limit=0)
        if r["ok"]:
            assert r["entries"] == [], f"limit 0 returned {len(r['entries'])} entries"
        else:
            err(r, "bad_request")


def _three_entries_fast(d):
    with d.client() as c:
        ids = [c.send(compile_msg(variant("mlp_fwd", k))) for k in range(3)]
        for i in ids:
            check_artifact_reply(c.wait(i), {"compiled"})


def test_evict(kilnd):
    arts = _three_entries(kilnd)
    s1, s2, s3 = sorted(arts)
    with kilnd.client() as c:
        # Exactly one of signature / older_than_s / all.
        err(c.request("evict"), "bad_request")
        err(c.request("evict", signature=s1, all=True), "bad_request")
        err(c.request("evict", signature=s1, older_than_s=0), "bad_request")
        err(c.request("evict", older_than_s=10, all=True), "bad_request")
        err(c.request("evict", all=False), "bad_request")
        err(c.request("evict", signature="xyz"), "bad_request")
        err(c.request("evict", older_than_s=-5), "bad_request")
        err(c.request("evict", older_than_s="1h"), "bad_request")
        assert len(ok(c.request("list"))["entries"]) == 3

        r = ok(c.request("evict", signature=s1))
        assert r["evicted"] == 1 and r["bytes"] == len(arts[s1])
        err(c.request("lookup", signature=s1), "not_found")  # gone from memory too
        err(c.request("evict", signature=s1), "not_found")
        err(c.request("evict", signature="0" * 64), "not_found")

        r = ok(c.request("evict", older_than_s=3600))
        assert r["evicted"] == 0 and r["bytes"] == 0
        assert {e["signature"] for e in ok(c.request("list"))["entries"]} == {s2, s3}

        r = ok(c.request("evict", all=True))
        assert r["evicted"] == 2 and r["bytes"] == len(arts[s2]) + len(arts[s3])
        assert ok(c.request("list"))["entries"] == []
        err(c.request("lookup", signature=s2), "not_found")
        # Compiled again from scratch.
        check_artifact_reply(compile_(c, graph("mlp_fwd")), {"compiled"})


def test_evict_older_than(kilnd):
    with kilnd.client() as c:
        r = compile_(c, graph("mlp_fwd"))
        check_artifact_reply(r, {"compiled"})
        # last_used has a 1-second resolution: once a second has passed,
        # older_than_s 0 ("not used since now") takes it.
        time.sleep(1.2)
        r2 = ok(c.request("evict", older_than_s=0))
        assert r2["evicted"] == 1 and r2["bytes"] > 0
        assert ok(c.request("list"))["entries"] == []
        err(c.request("lookup", signature=r["signature"]), "not_found")


def test_gc(kilnd):
    arts = _three_entries(kilnd)
    total = sum(len(a) for a in arts.values())
    with kilnd.client() as c:
        r = ok(c.request("gc"))  # the configured limit: nothing to do
        assert r["evicted"] == 0 and r["bytes"] == 0
        assert r["entries"] == 3 and r["store_bytes"] >= total
        r = ok(c.request("gc", max_bytes=total - 1))
        assert r["evicted"] >= 1 and r["bytes"] > 0
        assert r["store_bytes"] <= total - 1 and r["entries"] == 3 - r["evicted"]
        assert len(ok(c.request("list"))["entries"]) == r["entries"]
        r = ok(c.request("gc", max_bytes=0))
        assert r["entries"] == 0 and r["store_bytes"] == 0
        assert ok(c.request("list"))["entries"] == []
        err(c.request("gc", max_bytes="1M"), "bad_request")
        err(c.request("gc", max_bytes=-1), "bad_request")
    assert kilnd.stats()["store"]["entries"] == 0


def test_shutdown(make_kilnd):
    d = make_kilnd()
    with d.client() as c:
        err(c.request("shutdown", drain="yes"), "bad_request")
        r = ok(c.request("shutdown"))
        assert set(r) == {"v", "id", "ok"}
        assert c.closed_within(15)
    assert d.wait_exit(15) == 0
    assert not os.path.exists(d.socket_path)


def test_shutdown_no_drain(make_kilnd):
    d = make_kilnd()
    with d.client() as c:
        ok(c.request("shutdown", drain=False))
    assert d.wait_exit(15) == 0


def test_shutdown_no_drain_abandons_running_compile(make_kilnd):
    # drain: false does not wait: the running compile's client gets
    # shutting_down (not its artifact, nor silence) and kilnd exits 0.
    d = make_kilnd(args=["--workers", "1"])
    slow, admin = d.client(), d.client()
    try:
        sid = slow.send(compile_msg(variant("efficientnet_fwd", 7)))
        wait_for(lambda: ok(admin.request("status"))["stats"]["workers"]["busy"] == 1,
                 30, what="the compile to start")
        ok(admin.request("shutdown", drain=False))
        err(slow.wait(sid), "shutting_down")
    finally:
        slow.close()
        admin.close()
    assert d.wait_exit(30) == 0


def test_sigint_stops_cleanly(make_kilnd):
    d = make_kilnd()
    with d.client() as c:
        ok(c.request("hello"))
    d.signal(signal.SIGINT)
    assert d.wait_exit(30) == 0
    assert not os.path.exists(d.socket_path)


# ---- error codes ---------------------------------------------------------------


def test_bad_frame_zero_length(kilnd):
    with kilnd.client() as keep:
        with kilnd.client() as c:
            c.send_raw(b"\0\0\0\0")
            r = c.recv()
            err(r, "bad_frame")
            assert r["id"] == 0
            assert c.closed_within(10)
        ok(keep.request("hello"))
    with kilnd.client() as c2:
        ok(c2.request("hello"))
    st = kilnd.stats()
    assert st["bad_frames"] == 1 and st["errors"] == {"bad_frame": 1}


@pytest.mark.parametrize("length", [(64 << 20) + 1, 0xFFFFFFFF])
def test_bad_frame_oversize_length(kilnd, length):
    with kilnd.client() as c:
        ok(c.request("hello"))
        c.send_raw(struct.pack(">I", length))  # the header alone
        r = c.recv()
        err(r, "bad_frame")
        assert r["id"] == 0
        assert c.closed_within(10)
    with kilnd.client() as c2:
        ok(c2.request("hello"))


def test_bad_frame_configured_limit(make_kilnd):
    d = make_kilnd(args=["--max-frame-bytes", "4096"])
    with d.client() as c:
        c.send(compile_msg(graph("mlp_fwd")))  # ~900 bytes: fits
        check_artifact_reply(c.recv(), {"compiled"})
        c.send_raw(struct.pack(">I", 4097) + b"\x80" * 16)
        err(c.recv(), "bad_frame")
        assert c.closed_within(10)
    with d.client() as c:
        ok(c.request("hello"))


@pytest.mark.parametrize("body", [
    b"\xc1",                                   # reserved type byte
    b"\x83\xa1v\x01\xa2id",                    # truncated map
    pack({"v": 1, "id": 3, "op": "hello"}) + b"\x00",  # trailing bytes
    b"\xdf\xff\xff\xff\xff",                   # map count past the end
    b"\xc6\x7f\xff\xff\xff",                   # bin length past the end
])
def test_bad_frame_malformed_body(kilnd, body):
    with kilnd.client() as c:
        c.send_raw(frame(body))
        err(c.recv(), "bad_frame")
        assert c.closed_within(10)
    with kilnd.client() as c:
        ok(c.request("hello"))


def test_bad_request(kilnd):
    with kilnd.client() as c:
        def send_body(m):
            c.send_raw(frame(m))
            return c.recv()

        r = send_body({"v": 1, "op": "hello"})  # missing id
        err(r, "bad_request")
        assert r["id"] == 0
        r = send_body({"v": 1, "id": 11})  # missing op
        err(r, "bad_request")
        assert r["id"] == 11
        err(send_body({"v": 1, "id": 12, "op": "frobnicate"}), "bad_request")
        err(send_body({"v": 1, "id": 13, "op": 5}), "bad_request")
        err(send_body({"v": 1, "id": "14", "op": "hello"}), "bad_request")
        err(send_body({"v": 1, "id": -15, "op": "hello"}), "bad_request")
        err(send_body({"id": 16, "op": "hello"}), "bad_request")  # missing v
        err(send_body({"v": "1", "id": 17, "op": "hello"}), "bad_request")
        err(send_body({"v": 1, "id": 18, "op": None}), "bad_request")
        # Wrong field types of ops.
        err(c.request("compile", graph=[1, 2], target=CPU), "bad_request")
        err(c.request("compile", target=CPU), "bad_request")
        err(c.request("compile", graph=graph("mlp_fwd")), "bad_request")
        err(c.request("compile", graph=graph("mlp_fwd"), target=CPU, priority="urgent"),
            "bad_request")
        err(c.request("compile", graph=graph("mlp_fwd"), target=CPU, priority=1),
            "bad_request")
        err(c.request("compile", graph=graph("mlp_fwd"), target=CPU, options={"mode": "fastest"}),
            "bad_request")
        err(c.request("compile", graph=graph("mlp_fwd"), target="cpu"), "bad_request")
        err(c.request("compile", graph=graph("mlp_fwd"), target={"arch": "x86-64"}),
            "bad_request")
        err(c.request("lookup", signature=None), "bad_request")
        err(c.request("shutdown", drain=1), "bad_request")
        # The connection survived all of it.
        r = ok(c.request("hello"))
    assert kilnd.running()


def test_status_settings_of_the_wrong_type(kilnd):
    # PROTOCOL.md: an op field "of the wrong type" is bad_request (as
    # compile's options, list's limit or shutdown's drain are); settings is
    # a bool.
    with kilnd.client() as c:
        for v in ("yes", 1):
            r = c.request("status", settings=v)
            assert not r["ok"], f"status settings={v!r} was accepted (stats only)"
            err(r, "bad_request")
        ok(c.request("status", settings=False))


def test_unsupported_version(kilnd):
    with kilnd.client() as c:
        r = c.wait(c.send({"v": 2, "id": 21, "op": "hello"}))
        err(r, "unsupported_version")
        assert r["id"] == 21
        ok(c.request("hello"))  # kept


def test_invalid_graph(kilnd):
    g = graph("mlp_fwd")
    g["nodes"][1]["args"][2] = {"ref": 999}  # no such value
    with kilnd.client() as c:
        r = compile_(c, g)
        e = err(r, "invalid_graph")
        # PROTOCOL.md: `node` (optional) says where; the message names it.
        assert "node 1" in e["message"] and "999" in e["message"]
        assert e.get("node", 1) == 1
        g2 = graph("mlp_fwd")
        g2["format"] = "kiln.graph/9"
        err(compile_(c, g2), "invalid_graph")
        g3 = graph("mlp_fwd")
        g3["inputs"][0]["dtype"] = "f33"
        err(compile_(c, g3), "invalid_graph")
        check_artifact_reply(compile_(c, graph("mlp_fwd")), {"compiled"})


def test_unsupported_op_target(kilnd):
    with kilnd.client() as c:
        hello = ok(c.request("hello"))
        me = hello["targets"][0]
        err(compile_(c, graph("mlp_fwd"), target={"backend": "cuda", "arch": "sm_90"}),
            "unsupported_op")
        other = "aarch64" if me["arch"] != "aarch64" else "x86-64"
        err(compile_(c, graph("mlp_fwd"), target={"backend": "cpu", "arch": other}),
            "unsupported_op")
        err(compile_(c, graph("mlp_fwd"),
                     target={"backend": "cpu", "arch": me["arch"], "features": "+nosuchfeature"}),
            "unsupported_op")
        # The daemon's own target spelled out is the same as the default.
        r1 = compile_(c, graph("mlp_fwd"), target=dict(me))
        r2 = compile_(c, graph("mlp_fwd"))
        check_artifact_reply(r1, {"compiled"})
        check_artifact_reply(r2, {"memory"})
        assert r1["signature"] == r2["signature"]


def _nested(depth):
    x = 0
    for _ in range(depth):
        x = [x]
    return x


def test_too_large_nesting(kilnd):
    with kilnd.client() as c:
        # 24 containers in all (the map + 23 arrays) are allowed ...
        ok(c.request("hello", extra=_nested(23)))
        # ... 25 and more are not; the connection stays usable.
        c.send_raw(frame({"v": 1, "id": 7, "op": "hello", "extra": _nested(24)}))
        r = c.recv()
        err(r, "too_large")
        ok(c.request("hello"))


def test_too_large_object_count(kilnd):
    # More than 4 Mi msgpack objects in one body (a 4 MB frame of nils).
    with kilnd.client() as c:
        c.send_raw(frame({"v": 1, "id": 8, "op": "hello", "extra": [None] * (4 << 20)}))
        r = c.recv()  # rejected by the scan, before the id is read
        e = err(r, "too_large")
        assert "objects" in e["message"]
        ok(c.request("hello"))  # kept


def test_too_large_nodes(make_kilnd):
    d = make_kilnd(args=["--max-nodes", "3"])
    with d.client() as c:
        assert ok(c.request("hello"))["limits"]["max_nodes"] == 3
        err(compile_(c, graph("mlp_fwd")), "too_large")  # 6 nodes
        ok(c.request("hello"))
    assert d.stats()["errors"] == {"too_large": 1}


def test_busy_queue_full(make_kilnd):
    # One worker and a queue of one: of several distinct compiles sent at
    # once, one runs, one waits and the rest get busy.
    d = make_kilnd(args=["--workers", "1", "--queue-depth", "1"])
    conns = [d.client() for _ in range(5)]
    try:
        ids = [c.send(compile_msg(variant("transformer_layer_fwd", k)))
               for k, c in enumerate(conns)]
        replies = [c.wait(i) for c, i in zip(conns, ids)]
    finally:
        for c in conns:
            c.close()
    codes = [r["source"] if r["ok"] else r["error"]["code"] for r in replies]
    assert codes.count("busy") >= 2, codes
    assert codes.count("compiled") >= 1, codes
    assert set(codes) <= {"busy", "compiled"}, codes
    for r in replies:
        if r["ok"]:
            check_artifact_reply(r)
    st = d.stats()
    assert st["busy"] == codes.count("busy")
    assert st["errors"]["busy"] == codes.count("busy")
    # busy means "retry later": a retry now works.
    with d.client() as c:
        k = codes.index("busy")
        check_artifact_reply(compile_(c, variant("transformer_layer_fwd", k)), {"compiled"})


def test_busy_max_inflight(make_kilnd):
    d = make_kilnd(args=["--max-inflight", "2", "--workers", "1"])
    g = variant("cnn_fwd", 1)
    with d.client() as c:
        # Four requests in one write: two are in flight (compile + join),
        # the other two exceed max_inflight.
        data = b"".join(frame({"v": 1, "id": i, **compile_msg(g)}) for i in (1, 2, 3, 4))
        c.send_raw(data)
        replies = {}
        while len(replies) < 4:
            r = c.recv()
            replies[r["id"]] = r
        assert [replies[i]["ok"] for i in (1, 2)] == [True, True], replies
        assert {replies[1]["source"], replies[2]["source"]} == {"compiled", "joined"}
        err(replies[3], "busy")
        err(replies[4], "busy")
        assert "in flight" in replies[3]["error"]["message"]
        # Once answered, the connection takes requests again.
        check_artifact_reply(compile_(c, g), {"memory"})


def test_timeout_then_stored(make_kilnd):
    # One worker (compiling on one thread: conftest) and N distinct compiles
    # of efficientnet's forward (1.15 s each on a Zen 3, 0.62 s on a Zen 5):
    # the last waits for the other N - 1, and its client gets timeout after
    # compile_timeout_s (1 s, seen by a 1 s tick) well before its compile
    # ends. Three were enough until a host compiled one in 0.62 s: the
    # third then finished at 1.9 s, before the tick that would time it
    # out. With six the last ends after 3 s even on such a host. All
    # results are stored anyway.
    G, N = "efficientnet_fwd", 6
    d = make_kilnd(args=["--workers", "1", "--compile-timeout-s", "1"])
    with d.client() as c:
        ids = [c.send(compile_msg(variant(G, k))) for k in range(1, N + 1)]
        rs = [c.wait(i) for i in ids]
    e = err(rs[-1], "timeout")
    for r in rs[:-1]:
        assert r["ok"] or r["error"]["code"] == "timeout", r
    assert "stored" in e["message"]
    # The results land in the store: list shows all of them, lookup serves them.
    entries = wait_for(lambda: (lambda es: es if len(es) == N else None)(list_entries(d)),
                       90, interval=0.2, what="the timed-out compiles to be stored")
    sigs = {x["signature"] for x in entries}
    sig_in_msg = [s for s in sigs if s in e["message"]]
    assert len(sig_in_msg) == 1, (e["message"], sigs)
    with d.client() as c:
        for s in sigs:
            check_artifact_reply(c.request("lookup", signature=s), {"memory", "disk"})
        r = compile_(c, variant(G, N))
        check_artifact_reply(r, {"memory"})
        assert r["signature"] == sig_in_msg[0]
    st = d.stats()
    assert st["timeouts"] >= 1 and st["errors"]["timeout"] == st["timeouts"]
    assert st["compiled"] == N


def test_not_found(kilnd):
    with kilnd.client() as c:
        err(c.request("lookup", signature="f" * 64), "not_found")
        err(c.request("evict", signature="e" * 64), "not_found")
        ok(c.request("hello"))


NOBODY_CLIENT = r"""
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(30)
s.connect(sys.argv[1])
def read(n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise SystemExit("closed")
        b += c
    return b
for h in sys.argv[2:]:
    s.sendall(bytes.fromhex(h))
    (n,) = struct.unpack(">I", read(4))
    print(read(n).hex(), flush=True)
"""


def _drop_to_nobody():
    import pwd
    pw = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)


def _nobody_python():
    """A Python that user nobody may run: the venv's interpreter can live
    under a home only root may enter (pyenv's, under a /root of mode 0700),
    and the client needs nothing but the standard library, so the system's
    python3 serves too. Skips, saying why, where nobody can run neither."""
    why = []
    for exe in (sys.executable, "/usr/bin/python3"):
        try:
            subprocess.run([exe, "-I", "-S", "-c", "pass"], preexec_fn=_drop_to_nobody,
                           cwd="/", capture_output=True, timeout=60, check=True)
            return exe
        except (OSError, subprocess.SubprocessError) as e:
            why.append(f"{exe}: {e}")
    print("skipping: user nobody cannot run a Python here: " + "; ".join(why))
    pytest.skip("user nobody cannot run a Python here")


def _as_nobody(socket_path, requests):
    """Runs requests (maps) on one connection as user nobody; returns the
    replies."""
    exe = _nobody_python()
    frames = [frame({"v": 1, "id": i + 1, **m}).hex() for i, m in enumerate(requests)]
    p = subprocess.run([exe, "-I", "-S", "-c", NOBODY_CLIENT, socket_path] + frames,
                       preexec_fn=_drop_to_nobody, cwd="/", capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return [unpack(bytes.fromhex(line)) for line in p.stdout.decode().split()]


@pytest.fixture
def public_socket_dir():
    d = tempfile.mkdtemp(prefix="kilnd-pub-", dir="/tmp")
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _need_root_and_nobody():
    if os.geteuid() != 0:
        print("skipping: permission_denied from another uid needs root (to run a client as nobody)")
        pytest.skip("needs root to run a client as user nobody")
    try:
        import pwd
        pwd.getpwnam("nobody")
    except KeyError:
        print("skipping: there is no user nobody")
        pytest.skip("no user nobody")


def test_permission_denied_for_other_uid(make_kilnd, public_socket_dir):
    _need_root_and_nobody()
    path = os.path.join(public_socket_dir, "kilnd.sock")
    d = make_kilnd(socket_path=path, args=["--workers", "1"])
    # The daemon makes its socket 0660; open it up so nobody can connect.
    assert (os.stat(path).st_mode & 0o777) == 0o660
    os.chmod(path, 0o666)
    replies = _as_nobody(path, [
        {"op": "hello"},
        {"op": "status"},
        {"op": "status", "settings": True},
        {"op": "list"},
        {"op": "evict", "all": True},
        {"op": "gc"},
        {"op": "shutdown"},
        compile_msg(graph("mlp_fwd")),
    ])
    ok(replies[0])
    ok(replies[1])
    for r in replies[2:7]:
        err(r, "permission_denied")
    check_artifact_reply(replies[7], {"compiled"})
    assert d.running()
    # Root may do all of it.
    with d.client() as c:
        assert len(ok(c.request("list"))["entries"]) == 1
        ok(c.request("status", settings=True))
    assert d.stats()["errors"]["permission_denied"] == 5


def test_admin_group_allows_other_uid(make_kilnd, public_socket_dir):
    _need_root_and_nobody()
    import grp
    import pwd
    group = grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name
    path = os.path.join(public_socket_dir, "kilnd.sock")
    d = make_kilnd(socket_path=path, args=["--admin-group", group])
    os.chmod(path, 0o666)
    replies = _as_nobody(path, [{"op": "list"}, {"op": "status", "settings": True},
                                {"op": "gc"}])
    assert ok(replies[0])["entries"] == []
    assert ok(replies[1])["settings"]["admin_group"] == group
    ok(replies[2])


def test_shutting_down_during_drain(make_kilnd):
    d = make_kilnd(args=["--workers", "1"])
    slow = d.client()
    admin = d.client()
    try:
        sid = slow.send(compile_msg(graph("mobilenet_v2_fwd")))
        wait_for(lambda: ok(admin.request("status"))["stats"]["workers"]["busy"] == 1,
                 30, what="the compile to start")
        ok(admin.request("shutdown"))  # drain
        e = err(compile_(admin, graph("mlp_fwd")), "shutting_down")
        assert "shutting down" in e["message"]
        # The compile that was running still completes for its client.
        check_artifact_reply(slow.wait(sid), {"compiled"})
    finally:
        slow.close()
        admin.close()
    assert d.wait_exit(30) == 0


# `internal` covers out-of-memory, I/O errors of the store and libuv
# failures; none can be provoked from the outside of a healthy daemon
# without fault injection, so there is no test for it here (the store's
# I/O error paths are tested in tests/unit/cache/).


# ---- garbage and misbehaving clients --------------------------------------------


@pytest.mark.parametrize("garbage", [
    b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",   # a 1.2 GB "length"
    b"\x00\x00\x00\x08\xc1\xc1\xc1\xc1\xc1\xc1\xc1\xc1",   # reserved bytes
    struct.pack(">I", 1020) + (bytes(range(256)) * 4)[:1020],  # not one map
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\xee" * 64,  # a TLS hello
], ids=["http", "reserved", "not-a-map", "tls"])
def test_garbage_closes_only_that_connection(kilnd, garbage):
    with kilnd.client() as other:
        ok(other.request("hello"))
        with kilnd.client() as c:
            c.send_raw(garbage)
            assert c.closed_within(10)
        ok(other.request("hello"))
        check_artifact_reply(compile_(other, graph("mlp_fwd")), {"compiled", "memory"})
    with kilnd.client() as c:
        ok(c.request("hello"))
    st = kilnd.stats()
    assert st["bad_frames"] == 1


def _current_connections(d):
    return d.stats()["connections"]["current"]


def test_disconnect_mid_frame(kilnd):
    f = frame({"v": 1, "id": 1, **compile_msg(graph("mlp_fwd"))})
    c = kilnd.client()
    c.send_raw(f[: len(f) // 2])
    c.close()
    c = kilnd.client()
    c.send_raw(f[:2])  # half a header
    c.close()
    wait_for(lambda: _current_connections(kilnd) == 1, 10,
             what="the half-frame connections to be gone")
    with kilnd.client() as c:
        check_artifact_reply(compile_(c, graph("mlp_fwd")), {"compiled"})
    assert kilnd.stats()["bad_frames"] == 0


def test_disconnect_before_reply(kilnd):
    g = variant("gpt2_fwd", 3)
    c = kilnd.client()
    c.send(compile_msg(g))
    c.close()  # before the reply
    c = kilnd.client()
    c.send(compile_msg(g))  # joins the same compile, then leaves too
    c.close()
    with kilnd.client() as other:
        ok(other.request("hello"))
        check_artifact_reply(compile_(other, graph("mlp_fwd")), {"compiled"})
    wait_for(lambda: _current_connections(kilnd) == 1, 10,
             what="the closed connections to be gone")
    # The orphaned compile still finishes and is stored.
    es = wait_for(lambda: (lambda es: es if len(es) == 2 else None)(list_entries(kilnd)),
                  30, interval=0.1, what="the orphaned compile to be stored")
    with kilnd.client() as c:
        r = compile_(c, g)
        check_artifact_reply(r, {"memory"})
        assert r["signature"] in {e["signature"] for e in es}
    assert kilnd.stats()["compiled"] == 2


def test_client_that_never_reads(make_kilnd):
    d = make_kilnd(args=["--max-pending-write-bytes", "64k", "--workers", "1"])
    with d.client() as c:
        r = compile_(c, graph("mlp_fwd"))
        art = check_artifact_reply(r, {"compiled"})
        sig = r["signature"]
    n = 400  # ~400 x 17 KB of replies, far past the socket buffer
    lazy = d.client(timeout=10)
    lazy.send_raw(b"".join(frame({"v": 1, "id": i, "op": "lookup", "signature": sig})
                           for i in range(1, n + 1)))
    try:
        # Others are served meanwhile.
        def paused():
            return d.stats()["read_paused"] > 0
        wait_for(paused, 10, what="kilnd to stop reading from the lazy client")
        with d.client() as c:
            ok(c.request("hello"))
            assert check_artifact_reply(c.request("lookup", signature=sig), {"memory"}) == art
            check_artifact_reply(compile_(c, graph("mlp_bwd")), {"compiled"})
        # When the lazy client finally reads, it gets every reply.
        lazy.sock.settimeout(30)
        got = set()
        for _ in range(n):
            r = lazy.recv()
            assert r["ok"] and r["artifact"] == art
            got.add(r["id"])
        assert got == set(range(1, n + 1))
    finally:
        lazy.close()
    wait_for(lambda: _current_connections(d) == 1, 10, what="the lazy connection to be gone")


def test_client_that_never_reads_then_leaves(make_kilnd):
    d = make_kilnd(args=["--max-pending-write-bytes", "64k", "--workers", "1"])
    with d.client() as c:
        r = compile_(c, graph("mlp_fwd"))
        check_artifact_reply(r, {"compiled"})
        sig = r["signature"]
    lazy = d.client(timeout=10)
    lazy.send_raw(b"".join(frame({"v": 1, "id": i, "op": "lookup", "signature": sig})
                           for i in range(1, 301)))
    wait_for(lambda: d.stats()["read_paused"] > 0, 10, what="read_paused")
    lazy.close()  # with replies pending
    wait_for(lambda: _current_connections(d) == 1, 10, what="the lazy connection to be gone")
    with d.client() as c:
        ok(c.request("hello"))
        check_artifact_reply(c.request("lookup", signature=sig), {"memory"})


# ---- single flight ---------------------------------------------------------------


def test_64_concurrent_clients_same_graph(make_kilnd):
    d = make_kilnd(args=["--workers", "2"])
    n = 64
    g = graph("mlp_fwd")
    msg = frame({"v": 1, "id": 1, **compile_msg(g)})
    conns = [d.client() for _ in range(n)]
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i):
        c = conns[i]
        barrier.wait(30)
        c.send_raw(msg)
        results[i] = c.recv()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for c in conns:
            c.close()
    assert all(r is not None for r in results), "some clients got no reply"
    arts = [check_artifact_reply(r) for r in results]
    assert len(set(arts)) == 1, "artifacts differ"
    assert len({r["signature"] for r in results}) == 1
    sources = [r["source"] for r in results]
    assert sources.count("compiled") == 1, sources
    assert set(sources) <= {"compiled", "joined", "memory", "disk"}
    st = d.stats()
    assert st["compiled"] == 1
    assert st["joined"] + st["hits"]["memory"] + st["hits"]["disk"] == n - 1
    assert st["joined"] == sources.count("joined")


# ---- restarts ----------------------------------------------------------------------


def test_restart_then_disk_hit(make_kilnd):
    d = make_kilnd(args=["--workers", "1"])
    with d.client() as c:
        r = compile_(c, graph("mlp_fwd"))
        art = check_artifact_reply(r, {"compiled"})
    assert d.stop() == 0
    d.start()
    with d.client() as c:
        r2 = compile_(c, graph("mlp_fwd"))
        assert check_artifact_reply(r2, {"disk"}) == art
        assert r2["signature"] == r["signature"]
        r3 = compile_(c, graph("mlp_fwd"))
        assert check_artifact_reply(r3, {"memory"}) == art
    st = d.stats()
    assert st["compiled"] == 0 and st["hits"]["disk"] == 1 and st["hits"]["memory"] == 1


def _children(pid):
    out = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.update(int(x) for x in f.read().split())
    except OSError:
        pass
    return sorted(out)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill9_during_compiles_then_restart(make_kilnd):
    names = ["gpt2_fwd", "gpt2_bwd", "resnet18_fwd", "vit_fwd", "cnn_bwd"]
    d = make_kilnd(args=["--workers", "2"])
    d.expect_clean = False
    c = d.client()
    ids = [c.send(compile_msg(graph(n))) for n in names]
    # Once one has been stored (so the kill lands while others run or are
    # being written), kill -9.
    wait_for(lambda: len(list_entries(d)) >= 1, 60, interval=0.02,
             what="a first compile to be stored")
    helpers = _children(d.pid)  # compile worker processes, if any
    print("kilnd children at kill -9:", helpers)
    d.kill9()
    c.close()
    assert d.returncode == -signal.SIGKILL
    # Nothing kilnd started outlives it for long (a compile in progress may
    # finish first).
    wait_for(lambda: not any(_alive(p) for p in helpers), 60, interval=0.1,
             what=f"kilnd's child processes {helpers} to exit after kill -9")
    d.start()
    d.expect_clean = True
    with d.client() as c:
        ok(c.request("hello"))
        # Every graph compiles again: from the store, or compiled afresh;
        # never an error, never a damaged artifact.
        ids = [c.send(compile_msg(graph(n))) for n in names]
        sources = []
        for i in ids:
            r = c.wait(i)
            check_artifact_reply(r, {"disk", "compiled"})
            sources.append(r["source"])
        assert "disk" in sources, sources
        # And whatever the store lists is served intact.
        entries = ok(c.request("list"))["entries"]
        assert len(entries) == len(names)
        for e in entries:
            blob = check_artifact_reply(c.request("lookup", signature=e["signature"]),
                                        {"memory", "disk"})
            assert len(blob) == e["size"]
    st = d.stats()
    assert st["failed"] == 0 and st["store_put_errors"] == 0
    assert st["compiled"] == sources.count("compiled")


def test_sigterm_drain(make_kilnd):
    # One worker: the slow compile runs, a second one waits in the queue.
    d = make_kilnd(args=["--workers", "1", "--drain-timeout-s", "60"])
    slow = d.client()
    queued = d.client()
    other = d.client()
    try:
        sid = slow.send(compile_msg(graph("efficientnet_fwd")))
        wait_for(lambda: ok(other.request("status"))["stats"]["workers"]["busy"] == 1,
                 30, what="the compile to start")
        qid = queued.send(compile_msg(variant("mobilenet_v2_fwd", 5)))
        wait_for(lambda: ok(other.request("status"))["stats"]["queue"]["depth"] == 1,
                 30, what="the second compile to be queued")
        d.signal(signal.SIGTERM)

        def refused():
            try:
                with d.client(timeout=5) as c:
                    r = c.request("hello")
                    return r.get("ok") is False and r["error"]["code"] == "shutting_down"
            except (OSError, Closed):
                return True

        wait_for(refused, 10, what="new connections to be refused")
        assert not os.path.exists(d.socket_path)
        # The queued compile is cancelled ...
        err(queued.wait(qid), "shutting_down")
        assert d.running(), "kilnd exited before its running compile finished"
        # ... an open connection gets shutting_down for new compiles ...
        err(compile_(other, graph("mlp_fwd")), "shutting_down")
        # ... and the running compile's client still gets its artifact.
        check_artifact_reply(slow.wait(sid), {"compiled"})
    finally:
        for c in (slow, queued, other):
            c.close()
    assert d.wait_exit(30) == 0


# ---- systemd ------------------------------------------------------------------------


def test_notify_ready_and_stopping(make_kilnd, workdir):
    path = os.path.join(workdir, "notify.sock")
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(path)
    ns.settimeout(30)
    try:
        d = make_kilnd(env={"NOTIFY_SOCKET": path}, wait=False)
        got = []

        def read_until(word):
            while True:
                msg = ns.recv(4096).decode()
                got.append(msg)
                if word in msg.split("\n"):
                    return

        read_until("READY=1")
        d.wait_ready()
        with d.client() as c:
            ok(c.request("hello"))
        # A reload is bracketed by RELOADING=1 and READY=1.
        d.signal(signal.SIGHUP)
        read_until("RELOADING=1")
        read_until("READY=1")
        d.signal(signal.SIGTERM)
        read_until("STOPPING=1")
        assert d.wait_exit(30) == 0
        assert any(line.startswith("STATUS=") for m in got for line in m.split("\n"))
    finally:
        ns.close()


SSA = shutil.which("systemd-socket-activate") or "/usr/bin/systemd-socket-activate"


@pytest.mark.skipif(not os.path.exists(SSA), reason="systemd-socket-activate is not installed")
def test_socket_activation(make_kilnd, workdir):
    path = os.path.join(workdir, "activated.sock")
    # kilnd adopts the passed fd and creates no socket of its own (its
    # --socket points elsewhere and must stay absent).
    d = make_kilnd(socket_path=path, cmd_prefix=[SSA, "-l", path], wait=False,
                   args=["--workers", "1"])
    d.wait_ready()  # the first connection starts kilnd
    with Client(path) as c:
        r = ok(c.request("hello"))
        assert r["server"] == "kilnd"
        check_artifact_reply(compile_(c, graph("mlp_fwd")), {"compiled"})
    assert "socket activation" in d.read_log()
    assert d.stop() == 0


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_tcp_listener(make_kilnd):
    port = _free_port()
    d = make_kilnd(args=["--tcp-listen", f"127.0.0.1:{port}", "--workers", "1"])
    with Client(tcp=("127.0.0.1", port)) as c:
        r = ok(c.request("hello"))
        assert r["server"] == "kilnd"
        check_artifact_reply(compile_(c, graph("mlp_fwd")), {"compiled"})
        ok(c.request("status"))
        for m in ({"op": "list"}, {"op": "evict", "all": True}, {"op": "gc"},
                  {"op": "shutdown"}, {"op": "status", "settings": True}):
            err(c.wait(c.send(m)), "permission_denied")
        ok(c.request("hello"))
    assert d.running()
    # The Unix socket serves alongside, with admin rights for root.
    with d.client() as c:
        assert len(ok(c.request("list"))["entries"]) == 1


def test_sighup_reloads_config(make_kilnd, workdir):
    cfg = os.path.join(workdir, "kilnd.conf")
    with open(cfg, "w") as f:
        f.write("[kilnd]\nmax_inflight = 8\nqueue_depth = 10\n")
    d = make_kilnd(config=cfg, args=["--workers", "1"])
    s = d.status(settings=True)["settings"]
    assert s["max_inflight"] == "8" and s["queue_depth"] == "10"
    with open(cfg, "w") as f:
        f.write("[kilnd]\nmax_inflight = 16\nqueue_depth = 20\nworkers = 3\n")
    d.signal(signal.SIGHUP)
    wait_for(lambda: d.status(settings=True)["settings"]["max_inflight"] == "16", 10,
             what="the reload")
    s = d.status(settings=True)["settings"]
    assert s["queue_depth"] == "20"
    assert s["workers"] == "1"  # not reloadable (and the command line wins)
    st = d.stats()
    assert st["queue"]["max"] == 20 and st["workers"]["total"] == 1
    with d.client() as c:
        assert ok(c.request("hello"))["limits"]["max_inflight"] == 16
    # A broken file keeps the old settings and the daemon running.
    with open(cfg, "w") as f:
        f.write("[kilnd]\nmax_inflight = lots\n")
    d.signal(signal.SIGHUP)
    time.sleep(0.5)
    assert d.running()
    assert d.status(settings=True)["settings"]["max_inflight"] == "16"


def test_sighup_frame_limit_applies_to_open_connections(make_kilnd, workdir):
    # max_frame_bytes is reloadable ("apply at once"), and hello reports the
    # new value to a connection opened before the reload; that connection's
    # frames must then be held to the same limit.
    cfg = os.path.join(workdir, "kilnd.conf")
    with open(cfg, "w") as f:
        f.write("[kilnd]\nmax_frame_bytes = 2048\n")
    d = make_kilnd(config=cfg, args=["--workers", "1"])
    big = compile_msg(graph("transformer_layer_fwd"))
    assert len(pack({"v": 1, "id": 1, **big})) > 4096
    with d.client() as c:
        assert ok(c.request("hello"))["limits"]["max_frame_bytes"] == 2048
        with open(cfg, "w") as f:
            f.write("[kilnd]\nmax_frame_bytes = 64k\n")
        d.signal(signal.SIGHUP)
        wait_for(lambda: d.status(settings=True)["settings"]["max_frame_bytes"] == "65536",
                 10, what="the reload")
        # A new connection gets the new limit ...
        with d.client() as c2:
            check_artifact_reply(compile_(c2, big["graph"]), {"compiled"})
        # ... and so does the one opened before, which hello tells so.
        assert ok(c.request("hello"))["limits"]["max_frame_bytes"] == 65536
        c.send_raw(frame({"v": 1, "id": 99, **big}))
        r = c.recv()  # bad_frame here: the connection kept the old limit
        check_artifact_reply(r, {"memory"})


def test_idle_timeout(make_kilnd):
    d = make_kilnd(args=["--idle-timeout-s", "1"])
    with d.client() as c:
        ok(c.request("hello"))
        assert c.closed_within(10), "idle connection was not closed"
    with d.client() as c:
        st = ok(c.request("status"))["stats"]
        assert st["connections"]["idle_closed"] >= 1
        ok(c.request("hello"))


def test_max_connections(make_kilnd):
    d = make_kilnd(args=["--max-connections", "2"])
    a, b = d.client(), d.client()
    try:
        ok(a.request("hello"))
        ok(b.request("hello"))
        with d.client() as c:
            r = c.recv()
            err(r, "busy")
            assert "max_connections" in r["error"]["message"]
            assert c.closed_within(10)
        assert ok(a.request("status"))["stats"]["connections"]["rejected"] == 1
    finally:
        a.close()
        b.close()


def test_repeat_compile_by_bytes(make_kilnd):
    """A repeated compile whose bytes match an earlier one except for the
    id (memo.c) is answered from the hot map without decoding: the reply
    carries the new id and the same artifact; a different graph is never
    answered from it; once the hot map lost the artifact, the normal path
    answers again."""
    variant = _c.variant
    d = make_kilnd()
    g = graph("mlp_fwd")
    with d.client() as c:
        def compile_as(rid, gr):
            # v, id, op first, as libkiln and tests/integration/pyclient.py write them.
            c.send_raw(frame({"v": 1, "id": rid, "op": "compile",
                              "graph": gr, "target": {"backend": "cpu"}}))
            return c.wait(rid)

        r1 = compile_as(1, g)
        assert r1["ok"] and r1["source"] == "compiled"
        for rid in (2, 300, 70000, 2**40):  # ids of every msgpack width
            r = compile_as(rid, g)
            assert r["ok"] and r["id"] == rid and r["source"] == "memory"
            assert r["artifact"] == r1["artifact"]
            assert r["signature"] == r1["signature"]
        other = compile_as(5, variant("mlp_fwd", 1))
        assert other["ok"] and other["source"] == "compiled"
        assert other["signature"] != r1["signature"]
        st = d.stats()
        assert st["requests"]["compile"] == 6
        assert st["hits"]["memory"] == 4
        c.send_raw(frame({"v": 1, "id": 6, "op": "evict", "all": True}))
        assert c.wait(6)["ok"]
        r = compile_as(7, g)
        assert r["ok"] and r["source"] == "compiled"


def test_drain_writes_the_replies_already_queued(make_kilnd):
    """A shutdown while a client has many replies queued (it is not
    reading): kilnd stops reading, writes what it already answered, then
    exits 0; the client reads every reply whole before the end of the
    stream."""
    d = make_kilnd(args=["--max-pending-write-bytes", "1M"])
    g = graph("mlp_fwd")
    with d.client() as a, d.client() as b:
        a.send_raw(frame({"v": 1, "id": 1, "op": "compile", "graph": g,
                          "target": {"backend": "cpu"}}))
        assert a.wait(1)["ok"]
        n = 400
        data = b"".join(frame({"v": 1, "id": 10 + i, "op": "compile",
                               "graph": g, "target": {"backend": "cpu"}})
                        for i in range(n))
        b.sock.setblocking(False)
        sent = 0
        t0 = time.time()
        while sent < len(data) and time.time() - t0 < 5:
            try:
                sent += b.sock.send(data[sent:sent + 65536])
            except BlockingIOError:
                time.sleep(0.01)
        b.sock.setblocking(True)
        time.sleep(0.5)  # kilnd has answered what it read
        a.send_raw(frame({"v": 1, "id": 2, "op": "shutdown"}))
        assert a.wait(2)["ok"]
        got = 0
        try:
            while True:
                r = b.recv()
                # Answered before the drain: the artifact; read after it
                # began: shutting_down. Either way a whole reply.
                if r["ok"]:
                    assert len(r["artifact"]) > 0
                    got += 1
                else:
                    assert r["error"]["code"] == "shutting_down", r
        except Closed:
            pass
        assert got > 0
        assert b.buf == b""  # no reply was cut short
    assert d.wait_exit(60) == 0
    d.expect_clean = False
