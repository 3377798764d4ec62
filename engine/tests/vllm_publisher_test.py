#!/usr/bin/env python3
"""A KV-event publisher that is not ours: it speaks vLLM's wire format with
pyzmq and msgpack (Debian: python3-zmq, python3-msgpack) and checks what
kvc-events-listen (the C++ subscriber + KvEventIndex) makes of it.

Wire format, as vLLM's ZmqEventPublisher sends it:
  PUB:    [topic, sequence (8 bytes big-endian), msgpack(EventBatch)]
  ROUTER: request [identity, b"", start (8 bytes big-endian)];
          answers [identity, b"", sequence, payload] for every buffered batch
          from `start`, then [identity, b"", -1 (8 bytes, signed), b""].
EventBatch in the current map form: {"ts", "events", "data_parallel_rank"};
events tagged with "type"; block hashes are 32-byte sha256 digests. Fields
with defaults (extra_keys, group_idx, ...) are left out when unset, the way
msgspec's omit_defaults does; fields without defaults (lora_id, medium,
lora_name) are always sent. The array form (SGLang, older vLLM) puts the tag
first and sends integer hashes.

  vllm_publisher_test.py --listener build/.../kvc-events-listen --scenario NAME
"""

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import msgpack
import zmq

BLOCK = 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tokens(n, salt):
    return [(salt * 7919 + i * 31) % 50000 for i in range(n)]


def sha_chain(parent, toks):
    """vLLM-like engine hashes: sha256 over the parent digest and the block's tokens."""
    out = []
    for i in range(0, len(toks) - len(toks) % BLOCK, BLOCK):
        h = hashlib.sha256((parent or b"root") + repr(toks[i:i + BLOCK]).encode()).digest()
        out.append(h)
        parent = h
    return out


def stored_map(hashes, parent, toks, lora_id=None, medium="GPU", lora_name=None, **extra):
    event = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
             "token_ids": toks, "block_size": BLOCK, "lora_id": lora_id, "medium": medium,
             "lora_name": lora_name}
    event.update(extra)
    return event


def removed_map(hashes, medium="GPU"):
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def batch_map(events, rank=0):
    return {"ts": time.time(), "events": events, "data_parallel_rank": rank}


class Publisher:
    """One vLLM-style publisher: PUB + ROUTER replay with a bounded buffer."""

    def __init__(self, ctx, buffer_steps=10000, topic=b"kv-events"):
        self.pub_port, self.replay_port = free_port(), free_port()
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind(f"tcp://127.0.0.1:{self.pub_port}")
        self.router = ctx.socket(zmq.ROUTER)
        self.router.bind(f"tcp://127.0.0.1:{self.replay_port}")
        self.topic = topic
        self.seq = 0
        self.buffer = []
        self.buffer_steps = buffer_steps
        self.replays_served = 0

    def publish(self, obj=None, payload=None, drop=False):
        if payload is None:
            payload = msgpack.packb(obj, use_bin_type=True)
        seq_bytes = self.seq.to_bytes(8, "big")
        if not drop:
            self.pub.send_multipart([self.topic, seq_bytes, payload])
        self.buffer.append((self.seq, payload))
        self.buffer = self.buffer[-self.buffer_steps:]
        self.seq += 1

    def serve_replay(self):
        while self.router.poll(0):
            frames = self.router.recv_multipart()
            if len(frames) != 3:
                continue
            client, _, start = frames
            start = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= start:
                    self.router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([client, b"", (-1).to_bytes(8, "big", signed=True), b""])
            self.replays_served += 1


def run(listener, publishers, queries, expect_applied, expect_errors=0, ranks_per_source=1,
        scenario=None):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(queries, f)
        queries_path = f.name
    cmd = [listener, "--block-tokens", str(BLOCK), "--seconds", "15", "--queries", queries_path,
           "--expect-applied", str(expect_applied), "--expect-errors", str(expect_errors),
           "--ranks-per-source", str(ranks_per_source)]
    for p in publishers:
        cmd += ["--pub", f"tcp://127.0.0.1:{p.pub_port}",
                "--replay", f"tcp://127.0.0.1:{p.replay_port}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY", "listener did not start"
        time.sleep(0.5)  # PUB drops messages until the subscription has arrived
        scenario()
        deadline = time.time() + 20
        while proc.poll() is None and time.time() < deadline:
            for p in publishers:
                p.serve_replay()
            time.sleep(0.01)
        out, _ = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.unlink(queries_path)
    assert proc.returncode == 0, f"listener exited with {proc.returncode}"
    report = json.loads(out.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    return report


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def scenario_stored_removed_cleared(listener, ctx):
    a, b, c = tokens(3 * BLOCK, 1), tokens(2 * BLOCK + 5, 2), tokens(2 * BLOCK, 3)
    ha, hb, hc = sha_chain(None, a), sha_chain(None, b), sha_chain(None, c)
    p0, p1 = Publisher(ctx), Publisher(ctx)

    def go():
        # Worker 0: A in two pieces (the second names its parent), B, then A's leaf evicted.
        p0.publish(batch_map([stored_map(ha[:1], None, a[:BLOCK])]))
        p0.publish(batch_map([stored_map(ha[1:], ha[0], a[BLOCK:]),
                              stored_map(hb, None, b[:2 * BLOCK])]))
        p0.publish(batch_map([removed_map([ha[2]])]))
        # Worker 1: B, everything cleared, then C.
        p1.publish(batch_map([stored_map(hb, None, b[:2 * BLOCK])]))
        p1.publish(batch_map([{"type": "AllBlocksCleared"}]))
        p1.publish(batch_map([stored_map(hc, None, c)]))

    r = run(listener, [p0, p1], {"A": {"tokens": a}, "B": {"tokens": b}, "C": {"tokens": c}}, 6,
            scenario=go)
    check(r["queries"]["A"] == [2, 0], "A: two blocks left on worker 0 after the removal")
    check(r["queries"]["B"] == [2, 0], "B: cleared on worker 1")
    check(r["queries"]["C"] == [0, 2], "C: stored on worker 1 after the clear")
    check(r["workers"][0]["blocks"] == 4 and r["workers"][1]["blocks"] == 2, "block counts")
    check(r["stats"]["decode_errors"] == 0, "no decode error")


def scenario_lora_and_media(listener, ctx):
    x, y = tokens(2 * BLOCK, 4), tokens(3 * BLOCK, 5)
    hx_lora = sha_chain(b"lora", x)
    hx, hy = sha_chain(None, x), sha_chain(None, y)
    p = Publisher(ctx)

    def go():
        p.publish(batch_map([stored_map(hx_lora, None, x, lora_id=1, lora_name="sql-lora",
                                        extra_keys=[("sql-lora",), None], group_idx=0)]))
        p.publish(batch_map([stored_map(hy, None, y, medium="CPU")]))
        p.publish(batch_map([stored_map(hx[:1], None, x[:BLOCK])]))
        p.publish(batch_map([removed_map([hx_lora[1]], medium="CPU")]))

    r = run(listener, [p], {"x_lora": {"tokens": x, "lora": "sql-lora"}, "x_base": {"tokens": x},
                           "x_other_lora": {"tokens": x, "lora": "other"},
                           "y": {"tokens": y}}, 4, scenario=go)
    check(r["queries"]["x_lora"] == [2], "the adapter's blocks are found under its name")
    check(r["queries"]["x_base"] == [1], "the base model only has its own block")
    check(r["queries"]["x_other_lora"] == [0], "another adapter shares nothing")
    check(r["queries"]["y"] == [0], "CPU-medium blocks are not residency")
    check(r["workers"][0]["non_gpu_blocks"] == 4, "3 CPU blocks stored + 1 removed, tracked apart")


def scenario_replay_recovers_drop(listener, ctx):
    z = tokens(4 * BLOCK, 6)
    hz = sha_chain(None, z)
    p = Publisher(ctx)

    def go():
        for i in range(4):
            parent = hz[i - 1] if i else None
            p.publish(batch_map([stored_map(hz[i:i + 1], parent, z[i * BLOCK:(i + 1) * BLOCK])]),
                      drop=(i == 2))

    r = run(listener, [p], {"z": {"tokens": z}}, 4, scenario=go)
    check(r["queries"]["z"] == [4], "the dropped batch was replayed: the whole chain is known")
    check(r["stats"]["replay_requests"] >= 1 and r["stats"]["abandoned_gaps"] == 0, "replayed")
    check(r["workers"][0]["orphan_blocks"] == 0, "applied in order: no orphan")
    check(p.replays_served >= 1, "the publisher served a replay")


def scenario_malformed_refused(listener, ctx):
    g, h = tokens(2 * BLOCK, 7), tokens(BLOCK, 8)
    hg, hh = sha_chain(None, g), sha_chain(None, h)
    p = Publisher(ctx)

    def go():
        p.publish(batch_map([stored_map(hg, None, g)]))
        # A frame of two parts (no sequence number): refused.
        p.pub.send_multipart([p.topic, b"\x00" * 8])
        # A batch whose second event has a negative token id: the whole batch
        # is refused, including its valid first event.
        bad = stored_map(hh, None, h)
        bad["token_ids"] = [-1] + h[1:]
        p.publish(batch_map([removed_map([hg[1]]), bad]))

    r = run(listener, [p], {"g": {"tokens": g}, "h": {"tokens": h}}, 1, expect_errors=2,
            scenario=go)
    check(r["stats"]["decode_errors"] == 2, "both malformed messages counted")
    check("token_ids[0]" in r["stats"]["last_error"], "the error names the bad field")
    check(r["queries"]["g"] == [2], "nothing of the refused batch was applied (no removal)")
    check(r["queries"]["h"] == [0], "nothing of the refused batch was applied (no store)")


def scenario_array_form_and_ranks(listener, ctx):
    k = tokens(3 * BLOCK, 9)
    p = Publisher(ctx)
    ints = [-(2 ** 63) + 5, -42, 2 ** 63 + 7]  # SGLang: signed int64; vLLM: unsigned

    def go():
        events = [["BlockStored", ints[:2], None, k[:2 * BLOCK], BLOCK, None],
                  ["BlockStored", ints[2:], ints[1], k[2 * BLOCK:], BLOCK, None, "GPU", None,
                   None, 0, "future-field"]]
        p.publish([time.time(), events, 1])
        p.publish([time.time(), [["BlockRemoved", [ints[2]]]], 1, "future-batch-field"])

    r = run(listener, [p], {"k": {"tokens": k}}, 2, ranks_per_source=2, scenario=go)
    check(r["queries"]["k"] == [0, 2], "rank 1 is worker 1; removal by integer hash")


def scenario_replay_buffer_exceeded(listener, ctx):
    m = tokens(5 * BLOCK, 10)
    p = Publisher(ctx, buffer_steps=2)

    def go():
        for i in range(5):
            blk = m[i * BLOCK:(i + 1) * BLOCK]
            p.publish(batch_map([stored_map(sha_chain(None, blk), None, blk)]), drop=(i == 1))

    queries = {f"b{i}": {"tokens": m[i * BLOCK:(i + 1) * BLOCK]} for i in range(5)}
    r = run(listener, [p], queries, 4, scenario=go)
    check(r["stats"]["abandoned_gaps"] == 1, "the gap could not be replayed")
    check("no longer buffers" in r["stats"]["last_error"], "and the error says why")
    check(r["queries"]["b0"] == [0], "the worker's residency was cleared")
    check([r["queries"][f"b{i}"] for i in (2, 3, 4)] == [[1], [1], [1]],
          "batches after the gap are applied")


SCENARIOS = {name[len("scenario_"):]: fn for name, fn in globals().items()
             if name.startswith("scenario_")}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listener", required=True)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    args = parser.parse_args()
    ctx = zmq.Context()
    for name in args.scenario or sorted(SCENARIOS):
        print(f"--- {name}")
        SCENARIOS[name](args.listener, ctx)
        print(f"--- {name}: ok")
    ctx.destroy(linger=0)


if __name__ == "__main__":
    sys.exit(main())
