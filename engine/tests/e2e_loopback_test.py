#!/usr/bin/env python3
"""End to end on loopback: kvc-worker-emulator processes and kvc-gateway, all
real processes talking HTTP (and ZMQ). Python standard library only.

--scenario kvc (default): 1 prefill + 3 decode workers, the gateway running
the KVC-Router with KV events in vLLM's wire format.

Phase 1 replays a small multi-turn trace (6 sessions x 4 turns, half through
/v1/completions with X-Session-Id, half through /v1/chat/completions with a
body session_id, the sessions running concurrently, each closed-loop) and
checks that every request completed, that turn 0 was seeded and every later
turn went Direct on the worker that holds the session, and that the
router's index (fed only by KV events) holds exactly the blocks each
emulator holds.

Phase 2 floods the decode workers with new long sessions, so the emulators
evict idle sessions; the router's index must follow those evictions (again
block for block). Finally /metrics must parse as Prometheus text and add up.

--scenario ear: 2 colocated instances (--role instance) and the gateway
running the recommended policy, `ear`. Phase 1: concurrent sessions keep
their instance and every later turn finds its whole previous context cached.
Phase 2: one session's long turn makes its instance hot; another session
bound there moves to the idle instance with its KV (the instance reports
the moved context cached), and stays there afterwards. Phase 3: sessions
close (the instances drop their KV); then long first turns fill the live
memory and the next three wait in the gateway's queue: a placed session's
rewritten prompt does not wait behind them, closing a waiting session
cancels its turn (409), and each later close lets exactly the oldest
waiting turn in. /metrics adds up.

  e2e_loopback_test.py --emulator .../kvc-worker-emulator --gateway .../kvc-gateway
      [--scenario kvc|ear]
"""

import argparse
import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BLOCK = 16
MAX_TOKENS = 24
CAPACITY = 8000


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, headers=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read().decode()
        return r.status, (json.loads(raw) if raw.startswith("{") else raw)


class PortTaken(Exception):
    """A server could not bind the port free_port() picked: something else
    took it in between (the scenario is started again on fresh ports)."""


LOG_OF = {}  # pid -> the process's log file


def wait_healthy(url, proc, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            log = LOG_OF.get(proc.pid)
            if proc.returncode == 2 and log and "cannot listen" in open(log).read():
                raise PortTaken(f"{url}: its port was taken before it could listen")
            raise AssertionError(f"{url}: process exited with {proc.returncode}")
        try:
            if http(url + "/health", timeout=1)[0] == 200:
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.05)
    raise AssertionError(f"{url} did not become healthy")


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def filler(session, turn, n):
    words = ["read", "file", "patch", "test", "grep", "diff", "build", "run"]
    out = f"Session {session} turn {turn}: "
    i = 0
    while len(out) < n:
        out += words[(session * 7 + turn * 3 + i) % len(words)] + " "
        i += 1
    return out[:n]


def run_session(gateway, i, turns, log):
    chat = i % 2 == 1
    key = f"e2e-session-{i}"
    context, messages = "", []
    for t in range(turns):
        user = filler(i, t, 150 + 60 * ((i + t) % 4))
        headers = {} if i >= 3 else {"X-Session-Id": key}
        if chat:
            messages.append({"role": "user", "content": user})
            body = {"messages": messages, "max_tokens": MAX_TOKENS}
            if i >= 3:
                body["session_id"] = key
            status, r = http(gateway + "/v1/chat/completions", body, headers)
            answer = r["choices"][0]["message"]["content"]
            messages.append({"role": "assistant", "content": answer})
        else:
            prompt = context + user
            body = {"prompt": prompt, "max_tokens": MAX_TOKENS}
            if i >= 3:
                body["session_id"] = key
            status, r = http(gateway + "/v1/completions", body, headers)
            answer = r["choices"][0]["text"]
            context = prompt + answer
        log.append((i, t, status, r["kvc"]["mode"], r["kvc"]["decode_worker"], len(answer),
                    r["kvc"]["turn"]))


def parse_metrics(text):
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([0-9.eE+-]+|\+Inf|NaN)', line)
        check(m is not None, f"/metrics line is not Prometheus text: {line!r}")
        samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return samples


def index_matches(gateway, decodes):
    _, index = http(gateway + "/debug/index")
    blocks = [w["blocks"] for w in index["workers"]]
    emulated = [http(d + "/stats")[1]["resident_blocks"] for d in decodes]
    return blocks == emulated, blocks, emulated, index


def wait_index_matches(gateway, decodes, what):
    deadline = time.time() + 10
    while True:
        ok, blocks, emulated, index = index_matches(gateway, decodes)
        if ok:
            return blocks
        if time.time() > deadline:
            raise AssertionError(f"{what}: router index {blocks} != emulators {emulated}: {index}")
        time.sleep(0.05)


def run_kvc(args, start):
    common = ["--block-size", str(BLOCK), "--time-scale", "0.002"]
    pport = free_port()
    prefill = f"http://127.0.0.1:{pport}"
    pproc = start("prefill", [args.emulator, "--role", "prefill", "--port", str(pport)] + common)
    decodes, dprocs, events = [], [], []
    for d in range(3):
        port, pub, replay = free_port(), free_port(), free_port()
        decodes.append(f"http://127.0.0.1:{port}")
        events.append(f"tcp://127.0.0.1:{pub},tcp://127.0.0.1:{replay}")
        dprocs.append(start(f"decode{d}", [
            args.emulator, "--role", "decode", "--port", str(port), "--capacity-tokens",
            str(CAPACITY), "--kv-events", f"tcp://127.0.0.1:{pub}", "--kv-replay",
            f"tcp://127.0.0.1:{replay}", "--kv-topic", "kv-events"] + common))
    gport = free_port()
    gateway = f"http://127.0.0.1:{gport}"
    gcmd = [args.gateway, "--port", str(gport), "--block-tokens", str(BLOCK),
            "--prefill", prefill, "--max-tokens", str(MAX_TOKENS)]
    for d in range(3):
        gcmd += ["--decode", decodes[d], "--kv-events", events[d]]
    gproc = start("gateway", gcmd)
    wait_healthy(prefill, pproc)
    for d in range(3):
        wait_healthy(decodes[d], dprocs[d])
    wait_healthy(gateway, gproc)
    time.sleep(0.3)  # let the event subscriptions reach the publishers

    # --- phase 1: multi-turn trace ---------------------------------------
    log = []
    sessions, turns = 6, 4
    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        for f in [pool.submit(run_session, gateway, i, turns, log) for i in range(sessions)]:
            f.result()
    check(len(log) == sessions * turns, "every request of the trace completed")
    check(all(status == 200 and n == MAX_TOKENS for _, _, status, _, _, n, _ in log),
          "every answer is complete")
    by_session = {}
    for i, t, _, mode, worker, _, turn in sorted(log):
        by_session.setdefault(i, []).append((mode, worker, turn))
    for i, turns_seen in by_session.items():
        check([turn for _, _, turn in turns_seen] == list(range(turns)),
              f"session {i}: the gateway followed the conversation {turns_seen}")
        check(turns_seen[0][0] == "seed", f"session {i}: turn 0 is seeded: {turns_seen}")
        pinned = turns_seen[0][1]
        for mode, worker, turn in turns_seen[1:]:
            check(mode == "direct" and worker == pinned,
                  f"session {i} turn {turn}: {mode} on {worker}, expected direct on {pinned}")
    # Where new sessions land depends on timing (sessions that start at
    # once all see the same in-flight counts; chat sessions share their
    # first block), so the placement itself is not asserted.
    before = wait_index_matches(gateway, decodes, "after the trace")
    check(sum(before) > 0, f"the workers hold blocks: {before}")
    print(f"phase 1: {len(log)} requests, index blocks per worker {before}")

    # --- phase 2: evictions ------------------------------------------------
    flood = []
    # 8 x 3500 tokens exceed the three pools (3 x 7600 below rho * K_d).
    for j in range(8):
        status, r = http(gateway + "/v1/completions",
                         {"prompt": filler(100 + j, 0, 3500), "max_tokens": MAX_TOKENS},
                         {"X-Session-Id": f"flood-{j}"})
        check(status == 200, "flood request completed")
        flood.append(r["kvc"]["mode"])
    evictions = sum(http(d + "/stats")[1]["evictions"] for d in decodes)
    check(evictions > 0, "the flood made the emulators evict sessions")
    after = wait_index_matches(gateway, decodes, "after the evictions")
    _, index = http(gateway + "/debug/index")
    check(all(w["unknown_removals"] == 0 and w["orphan_blocks"] == 0 and
              w["abandoned_gaps"] == 0 for w in index["workers"]),
          f"every event was understood: {index}")
    print(f"phase 2: modes {flood}, {evictions} evictions, index blocks {after}")

    # --- /metrics ----------------------------------------------------------
    status, text = http(gateway + "/metrics")
    m = parse_metrics(text)
    total = len(log) + len(flood)
    modes = {k: m[f'kvc_decisions_total{{mode="{k}"}}'] for k in
             ("direct", "seed", "reseed", "fallback")}
    check(sum(modes.values()) == total, f"decisions add up to the requests: {modes}")
    check(m['kvc_requests_total{status="ok"}'] == total, "requests_total ok")
    check(m['kvc_requests_total{status="error"}'] == 0, "no failed request")
    check(modes["direct"] == sessions * (turns - 1), f"direct decisions: {modes}")
    rejections = sum(v for k, v in m.items() if k.startswith("kvc_admission_rejections_total"))
    attempts = m["kvc_admission_attempts_total"]
    check(attempts == modes["direct"] + modes["seed"] + modes["reseed"] + rejections,
          f"every admission attempt admitted or was rejected: {attempts} vs {modes} + "
          f"{rejections}")
    check(m["kvc_admission_latency_seconds_count"] == attempts, "histogram count")
    check(m['kvc_admission_latency_seconds_bucket{le="+Inf"}'] == attempts, "+Inf bucket")
    buckets = [v for k, v in m.items() if k.startswith("kvc_admission_latency_seconds_bucket")]
    check(buckets == sorted(buckets), "histogram buckets are cumulative")
    check(all(m[f'kvc_inflight_requests{{worker="{d}"}}'] == 0 for d in range(3)),
          "nothing left in flight")
    check(m["kvc_gateway_sessions"] == sessions + len(flood),
          f"one conversation per session: {m['kvc_gateway_sessions']}")
    check([m[f'kvc_index_blocks{{worker="{d}"}}'] for d in range(3)] == after,
          "kvc_index_blocks matches the emulators")
    print("metrics add up:", modes, "attempts", attempts, "rejections", rejections)

    # --- "stream": true over decode workers that answer in one piece -------
    chunks = stream_events(gateway, "/v1/completions",
                           {"prompt": filler(90, 0, 400), "stream": True}, "kvc-streamed")
    check(len(chunks) == 2 and len(chunks[0][1]["choices"][0]["text"]) == MAX_TOKENS and
          chunks[1][1]["choices"][0]["finish_reason"] == "length" and
          chunks[1][1]["kvc"]["policy"] == "kvc",
          f"a plain answer is relayed as one text chunk and the last one: {chunks}")
    print("streamed: the decode worker's plain answer as one chunk")

    # --- what coding agents send: text parts, tools, tool calls and results --
    tools = [{"type": "function", "function": {"name": "read_file",
                                               "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": [{"type": "text", "text": filler(91, 0, 300)}]},
                {"role": "user", "content": "fix the failing test"}]
    headers = {"X-Session-Id": "agent"}
    _, first = http(gateway + "/v1/chat/completions",
                    {"messages": messages, "tools": tools, "max_completion_tokens": 8}, headers)
    answer = first["choices"][0]["message"]["content"]
    check(first["usage"]["completion_tokens"] == 8 and first["kvc"]["turn"] == 0,
          f"max_completion_tokens is the limit: {first['usage']}")
    messages += [{"role": "assistant", "content": answer,
                  "tool_calls": [{"id": "c1", "type": "function",
                                  "function": {"name": "read_file", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": filler(91, 1, 120)}]
    _, second = http(gateway + "/v1/chat/completions",
                     {"messages": messages, "tools": tools, "max_tokens": 8}, headers)
    check(second["kvc"]["turn"] == 1 and second["kvc"]["mode"] == "direct",
          f"the tool call and its result continue the session: {second['kvc']}")
    _, by_ids = http(gateway + "/v1/completions",
                     {"prompt": [list(filler(92, 0, 100).encode())], "max_tokens": 4},
                     {"X-Session-Id": "ids"})
    check(by_ids["usage"]["prompt_tokens"] == 100, f"a token-id prompt: {by_ids['usage']}")
    for body, names in (({"prompt": ["a", "b"]}, "2 prompts"),
                        ({"prompt": [1, "x"]}, "token ids"),
                        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                         "only \"text\" parts")):
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        try:
            http(gateway + path, body)
            check(False, f"{body} is refused")
        except urllib.error.HTTPError as e:
            message = json.loads(e.read().decode())["error"]["message"]
            check(e.code == 400 and names in message, f"{body}: HTTP {e.code} {message}")
    print("agents' chat: text parts, tools, a tool call and its result continue the session")

    # Draining a decode worker is for good under kvc: resuming it is refused.
    _, drained = http(gateway + "/admin/instances/2/drain", {})
    check(drained == {"instance": 2, "drained": True}, f"drain answer: {drained}")
    try:
        http(gateway + "/admin/instances/2/resume", {})
        check(False, "resuming a kvc decode worker is refused")
    except urllib.error.HTTPError as e:
        check(e.code == 409, f"resume under kvc: HTTP {e.code}")
    r = completion(gateway, "after-drain", filler(93, 0, 200))
    check(r["kvc"]["decode_worker"] != 2, f"nothing new goes to the drained worker: {r['kvc']}")
    print("drain: a kvc decode worker drained for good")
    try:
        http(gateway + "/admin/instances", {"url": "http://127.0.0.1:1"})
        check(False, "adding a decode worker under kvc is refused")
    except urllib.error.HTTPError as e:
        message = json.loads(e.read().decode())["error"]["message"]
        check(e.code == 409 and "affinity" in message, f"add under kvc: HTTP {e.code} {message}")
    return 0


EAR_CAPACITY = 20000


def completion(gateway, key, prompt, max_tokens=MAX_TOKENS, timeout=60):
    status, r = http(gateway + "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens},
                     {"X-Session-Id": key}, timeout=timeout)
    check(status == 200, f"{key}: completed")
    return r


def poll_metrics(gateway, done, what, timeout=20):
    """Polls the gateway's metrics until done(metrics); returns them."""
    deadline = time.time() + timeout
    while True:
        m = parse_metrics(http(gateway + "/metrics")[1])
        if done(m):
            return m
        check(time.time() < deadline, f"{what} (metrics: {m})")
        time.sleep(0.05)


def open_stream(gateway, body, session, path="/v1/completions"):
    """Sends a "stream": true request; returns the open response."""
    req = urllib.request.Request(gateway + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json",
                                          "X-Session-Id": session})
    return urllib.request.urlopen(req, timeout=30)


def stream_events(gateway, path, body, session):
    """A "stream": true request: its events, read as they arrive, with their
    arrival times; checks the event-stream type and the closing [DONE]."""
    events = []
    with open_stream(gateway, body, session, path) as r:
        check(r.headers.get("Content-Type", "").startswith("text/event-stream"),
              f"{path}: event stream, got {r.headers.get('Content-Type')}")
        for line in r:
            line = line.decode().rstrip("\n")
            if line.startswith("data: "):
                events.append((time.time(), line[len("data: "):]))
    check(events and events[-1][1] == "[DONE]", f"{path}: ends with [DONE]: {events[-1:]}")
    return [(t, json.loads(e)) for t, e in events[:-1]]


def close_session(gateway, key):
    req = urllib.request.Request(gateway + "/v1/sessions/" + key, method="DELETE")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read().decode())


def run_ear(args, start):
    # A slower prefill leaves phase 2 a window in which the hot instance's
    # long prompt is still prefilling.
    common = ["--block-size", str(BLOCK), "--time-scale", "0.5", "--prefill-scale", "8",
              "--capacity-tokens", str(EAR_CAPACITY)]
    instances, iprocs = [], []
    for d in range(2):
        port = free_port()
        instances.append(f"http://127.0.0.1:{port}")
        iprocs.append(start(f"instance{d}", [args.emulator, "--role", "instance", "--port",
                                             str(port)] + common))
    gport = free_port()
    gateway = f"http://127.0.0.1:{gport}"
    gcmd = [args.gateway, "--port", str(gport), "--block-tokens", str(BLOCK), "--policy", "ear",
            "--kv-capacity-tokens", str(EAR_CAPACITY), "--hot-prefill-tokens", "1000",
            "--session-idle", "60", "--max-tokens", str(MAX_TOKENS),
            # The breaker checks after the instance stops must finish inside
            # the cooldown, on however slow a machine.
            "--breaker-cooldown", "300"]
    for url in instances:
        gcmd += ["--instance", url]
    gproc = start("gateway", gcmd)
    for d in range(2):
        wait_healthy(instances[d], iprocs[d])
    wait_healthy(gateway, gproc)
    # Bad input is refused with the field and value named, and runs nothing.
    for field, value in (("max_tokens", -3), ("turn", "x")):
        try:
            http(instances[0] + "/generate", {"session_id": 1, "token_ids": [1, 2], field: value})
            check(False, f"{field}={value!r} is refused")
        except urllib.error.HTTPError as e:
            message = json.loads(e.read().decode())["error"]
            check(e.code == 400 and field in message and json.dumps(value) in message,
                  f"{field}={value!r}: HTTP {e.code} {message}")
    check(http(instances[0] + "/stats")[1]["generated"] == 0, "nothing ran for bad input")

    # --- phase 1: sessions keep their instance and their cache --------------
    sessions, turns = 4, 4
    contexts = {i: "" for i in range(sessions)}
    homes = {}
    placed = 0

    def run(i):
        nonlocal placed
        for t in range(turns):
            prompt = contexts[i] + filler(i, t, 200 + 50 * ((i + t) % 3))
            r = completion(gateway, f"ear-{i}", prompt)
            k = r["kvc"]
            check(k["turn"] == t and k["policy"] == "ear", f"session {i} turn {t}: {k}")
            if t == 0:
                homes[i] = k["decode_worker"]
                check(k["mode"] == "seed", f"session {i}: turn 0 is seeded: {k}")
            else:
                check(k["decode_worker"] == homes[i] and k["mode"] == "direct" and
                      k["cached_tokens"] >= len(contexts[i]) and k["migrated_from"] is None,
                      f"session {i} turn {t}: expected direct on {homes[i]} with "
                      f"{len(contexts[i])} tokens cached: {k}")
            contexts[i] = prompt + r["choices"][0]["text"]
            placed += 1

    with concurrent.futures.ThreadPoolExecutor(sessions) as pool:
        for f in [pool.submit(run, i) for i in range(sessions)]:
            f.result()
    print(f"phase 1: {placed} turns, homes {homes}")

    # --- phase 2: a hot instance sheds a session with its KV ----------------
    by_home = {}
    for i, d in homes.items():
        by_home.setdefault(d, []).append(i)
    # Four sessions on two instances: at least two share one.
    pair = next((v for v in by_home.values() if len(v) >= 2), None)
    check(pair is not None, f"two sessions share an instance: {homes}")
    hot, other = homes[pair[0]], 1 - homes[pair[0]]
    busy, mover = pair[0], pair[1]
    long_prompt = contexts[busy] + filler(busy, 10, 4000)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(completion, gateway, f"ear-{busy}", long_prompt, 800)
        deadline = time.time() + 10
        while True:
            m = parse_metrics(http(gateway + "/metrics")[1])
            if m[f'kvc_pending_prefill_tokens{{worker="{hot}"}}'] >= 4000:
                break
            check(time.time() < deadline, "the long turn was booked as pending prefill")
            time.sleep(0.01)
        prompt = contexts[mover] + filler(mover, 11, 200)
        r = completion(gateway, f"ear-{mover}", prompt)
        k = r["kvc"]
        check(not running.done(), "the long turn was still running when the other was placed")
        check(k["migrated_from"] == hot and k["decode_worker"] == other and k["migrated"],
              f"session {mover} moved off the hot instance {hot}: {k}")
        check(k["cached_tokens"] >= len(contexts[mover]),
              f"the move brought the context ({len(contexts[mover])} tokens): {k}")
        # The ledger booked what the move left to prefill (the move's answer,
        # not the policy's block-rounded estimate).
        check(k["prefill_booked_tokens"] == len(prompt) - len(contexts[mover]),
              f"booked the append ({len(prompt) - len(contexts[mover])} tokens): {k}")
        contexts[mover] = prompt + r["choices"][0]["text"]
        # The instance streams: the long turn's prefill stops counting at its
        # first token, while it still decodes.
        deadline = time.time() + 10
        while True:
            m = parse_metrics(http(gateway + "/metrics")[1])
            if m[f'kvc_pending_prefill_tokens{{worker="{hot}"}}'] == 0:
                break
            check(time.time() < deadline, "the long turn's prefill was released")
            time.sleep(0.01)
        inflight = m[f'kvc_inflight_requests{{worker="{hot}"}}']
        check(not running.done() and inflight == 1,
              "released at the first token, while the long turn still decoded: "
              f"done={running.done()} inflight={inflight}")
        rb = running.result()
        check(rb["kvc"]["decode_worker"] == hot, f"the long turn stayed home: {rb['kvc']}")
        contexts[busy] = long_prompt + rb["choices"][0]["text"]
    prompt = contexts[mover] + filler(mover, 12, 200)
    k = completion(gateway, f"ear-{mover}", prompt)["kvc"]
    check(k["decode_worker"] == other and k["mode"] == "direct" and k["migrated_from"] is None,
          f"session {mover} stays where it moved: {k}")
    stats = [http(u + "/stats")[1] for u in instances]
    check(stats[other]["migrations_in"] == 1 and stats[hot]["migrations_out"] == 1,
          f"one KV move between the instances: {stats}")
    print(f"phase 2: session {mover} moved {hot} -> {other} while session {busy} ran long")

    # --- phase 3: closing sessions, then load control -----------------------
    for i in range(sessions):
        out = close_session(gateway, f"ear-{i}")
        check(out["closed"] and len(out["instances_closed"]) >= 1, f"closed ear-{i}: {out}")
    stats = [http(u + "/stats")[1] for u in instances]
    check(all(st["sessions"] == 0 and st["used_tokens"] == 0 for st in stats),
          f"closed sessions left no KV on the instances: {stats}")
    try:
        close_session(gateway, "ear-0")
        check(False, "closing an unknown session is refused")
    except urllib.error.HTTPError as e:
        check(e.code == 404, f"unknown session: HTTP {e.code}")
    _, debug = http(gateway + "/debug/index")
    check(debug["live_context_tokens"] == 0, f"nothing counted live after the closes: {debug}")
    # 6,000-token tasks: five fill 0.8 of the 2 x 20,000 tokens; later ones wait.
    for j in range(5):
        k = completion(gateway, f"task-{j}", filler(50 + j, 0, 6000))["kvc"]
        check(k["held_s"] == 0, f"task {j} went straight in: {k}")

    def queue_length():
        return parse_metrics(http(gateway + "/metrics")[1])["kvc_hold_queue_length"]

    def wait_queue(n):
        deadline = time.time() + 20
        while queue_length() != n:
            check(time.time() < deadline, f"the load-control queue reaches {n}")
            time.sleep(0.02)

    def attempt(key, prompt):
        try:
            return 200, completion(gateway, key, prompt)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode())

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        t5 = pool.submit(attempt, "task-5", filler(55, 0, 6000))
        wait_queue(1)
        t6 = pool.submit(attempt, "task-6", filler(56, 0, 6000))
        wait_queue(2)
        t7 = pool.submit(attempt, "task-7", filler(57, 0, 6000))
        wait_queue(3)
        # A placed session's fresh chain (its prompt rewritten) is not new:
        # it does not wait behind the queue.
        k = completion(gateway, "task-1", filler(61, 0, 3000))["kvc"]
        check(k["turn"] == 0 and k["held_s"] == 0 and queue_length() == 3,
              f"a bound session's rewritten prompt skipped the queue: {k}")
        # Closing a session whose first turn waits cancels that turn.
        close_session(gateway, "task-6")
        status, body = t6.result(timeout=10)
        check(status == 409, f"the closed session's waiting turn was cancelled: {status} {body}")
        wait_queue(2)
        # One close frees room for one task: the oldest goes, the next waits.
        close_session(gateway, "task-0")
        status, r5 = t5.result(timeout=30)
        check(status == 200 and r5["kvc"]["held_s"] > 0, f"task 5 went in first: {r5}")
        time.sleep(0.3)
        check(not t7.done() and queue_length() == 1, "task 7 still waits behind it")
        close_session(gateway, "task-2")
        status, r7 = t7.result(timeout=30)
        check(status == 200 and r7["kvc"]["held_s"] > 0, f"task 7 went in after task 5: {r7}")
    m = parse_metrics(http(gateway + "/metrics")[1])
    check(m["kvc_held_first_turns_total"] == 2 and m["kvc_hold_queue_length"] == 0,
          "two first turns were held and placed")
    # Every new session's first turn waited its arrival window (a share of
    # its prefill, at most --max-arrival-window), shortest first.
    windowed = m["kvc_arrival_window_first_turns_total"]
    check(windowed >= 9 and 0 < m["kvc_arrival_window_wait_seconds_total"] <= 0.25 * windowed + 1,
          f"first turns waited their arrival windows: {windowed}, "
          f"{m['kvc_arrival_window_wait_seconds_total']} s")
    total = placed + 3 + 5 + 1 + 2
    modes = {x: m[f'kvc_decisions_total{{mode="{x}"}}'] for x in ("direct", "seed", "reseed")}
    check(sum(modes.values()) == total and m['kvc_requests_total{status="ok"}'] == total,
          f"decisions add up to the requests: {modes}")
    check(m['kvc_requests_total{status="error"}'] == 1, "the cancelled turn counts as failed")
    check(m['kvc_session_migrations_total{status="ok"}'] == 1, "one migration counted")
    # Open: tasks 1, 3, 4, 5, 7 (closed and cancelled sessions are forgotten);
    # a request without a session is a session of one turn, over at once.
    check(m["kvc_gateway_sessions"] == 5, f"sessions tracked: {m['kvc_gateway_sessions']}")
    status, r = http(gateway + "/v1/completions", {"prompt": filler(70, 0, 500)})
    check(status == 200 and r["kvc"]["session"].startswith("anonymous-"), "anonymous request")
    m = parse_metrics(http(gateway + "/metrics")[1])
    check(m["kvc_gateway_sessions"] == 5, "the anonymous session was not kept")
    check(all(m[f'kvc_inflight_requests{{worker="{d}"}}'] == 0 and
              m[f'kvc_pending_prefill_tokens{{worker="{d}"}}'] == 0 for d in range(2)),
          "every ticket gave its load back")
    # A streamed first turn waits with keep-alive comments; its client
    # leaving takes it out of the queue: it is never placed.
    r = open_stream(gateway, {"prompt": filler(58, 0, 6000), "stream": True}, "task-8")
    wait_queue(1)
    line = r.readline().decode()
    check(line.startswith(": waiting"), f"a keep-alive comment while queued: {line!r}")
    r.close()
    # The turn leaves the queue, then is counted and forgotten: poll for all.
    m = poll_metrics(gateway, lambda m: (m["kvc_hold_queue_length"] == 0 and
                                         m['kvc_requests_total{status="error"}'] == 2 and
                                         m["kvc_gateway_sessions"] == 5),
                     "the abandoned queued turn failed and was forgotten")
    check(m["kvc_held_first_turns_total"] == 2, "the abandoned turn was never placed")
    print(f"phase 3: tasks 5 and 7 waited {r5['kvc']['held_s']:.2f} s and "
          f"{r7['kvc']['held_s']:.2f} s, in order; a close cancelled task 6; task 8's client "
          f"left the queue; modes {modes}")

    # --- "stream": true: OpenAI's event format, same session rules ----------
    def stream(path, body, session="streamed"):
        return stream_events(gateway, path, body, session)

    def streamed_text(path, body, field):
        chunks = stream(path, body)
        text_chunks, last = chunks[:-1], chunks[-1][1]
        check(last["choices"][0]["finish_reason"] == "length" and
              all(c["choices"][0]["finish_reason"] is None for _, c in text_chunks),
              f"{path}: text chunks, then one with the finish reason: {chunks}")
        text = "".join(field(c["choices"][0]) for _, c in text_chunks)
        check(len(text) == last["usage"]["completion_tokens"] == STREAM_TOKENS,
              f"{path}: the chunks add up to the answer ({STREAM_TOKENS} tokens): {text!r}")
        # The emulator decodes 256 tokens in ~0.9 s and sends them in 33
        # events; the gateway relays them as they come, not at the end.
        spread = text_chunks[-1][0] - text_chunks[0][0]
        check(len(text_chunks) >= 8 and spread > 0.3,
              f"{path}: {len(text_chunks)} text chunks over {spread:.2f} s")
        return text_chunks, last, text

    STREAM_TOKENS = 256
    prompt = filler(80, 0, 900)
    text_chunks, last, text = streamed_text(
        "/v1/completions", {"prompt": prompt, "max_tokens": STREAM_TOKENS, "stream": True},
        lambda choice: choice["text"])
    check(text_chunks[0][1]["object"] == "text_completion" and text.startswith("[s") and
          last["kvc"]["turn"] == 0 and last["kvc"]["policy"] == "ear",
          f"streamed completion: {text!r} {last}")
    print(f"streamed: {len(text_chunks)} completion chunks over "
          f"{text_chunks[-1][0] - text_chunks[0][0]:.2f} s")
    text_chunks, last, text = streamed_text(
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": prompt}], "max_tokens": STREAM_TOKENS,
         "stream": True},
        lambda choice: choice["delta"]["content"])
    first_delta = text_chunks[0][1]["choices"][0]["delta"]
    check(text_chunks[0][1]["object"] == "chat.completion.chunk" and
          first_delta["role"] == "assistant" and
          all("role" not in c["choices"][0]["delta"] for _, c in text_chunks[1:]) and
          last["choices"][0]["delta"] == {},
          f"streamed chat: the first delta names the role, the last is empty: {text_chunks[:2]}")
    try:
        http(gateway + "/v1/completions", {"prompt": prompt, "stream": "yes"})
        check(False, "a non-boolean stream is refused")
    except urllib.error.HTTPError as e:
        message = json.loads(e.read().decode())["error"]["message"]
        check(e.code == 400 and "stream" in message and '"yes"' in message,
              f"stream=\"yes\": HTTP {e.code} {message}")
    # A client that goes away mid-stream stops the writing, not the turn: it
    # completes on the instance, counts as served and gives its load back.
    # (The last events may still fit the socket's buffer; a write that fails
    # is covered by the CompletionEventStream unit test.)
    before = parse_metrics(http(gateway + "/metrics")[1])
    live_before = http(gateway + "/debug/index")[1]["live_context_tokens"]
    r = open_stream(gateway, {"prompt": filler(82, 0, 400), "max_tokens": STREAM_TOKENS,
                              "stream": True}, "impatient")
    first = r.readline().decode()
    check(first.startswith("data: "), f"the first event came: {first!r}")
    r.close()
    ok_before = before['kvc_requests_total{status="ok"}']
    poll_metrics(gateway, lambda m: (
        m['kvc_requests_total{status="ok"}'] == ok_before + 1 and
        all(m[f'kvc_inflight_requests{{worker="{d}"}}'] == 0 and
            m[f'kvc_pending_prefill_tokens{{worker="{d}"}}'] == 0 for d in range(2))),
        "the abandoned turn completed and gave its load back")
    _, debug = http(gateway + "/debug/index")
    check(debug["live_context_tokens"] >= live_before + 400,
          f"the abandoned turn's context (400 prompt tokens and its answer) is counted live: "
          f"{live_before} -> {debug['live_context_tokens']}")
    print("streamed: a client that left mid-stream; its turn completed and released")

    # Draining an instance that still answers: its session leaves with its KV.
    drain_prompt = filler(84, 0, 300)
    r = completion(gateway, "drainee", drain_prompt)
    x = r["kvc"]["decode_worker"]
    http(gateway + f"/admin/instances/{x}/drain", {})
    r = completion(gateway, "drainee", drain_prompt + r["choices"][0]["text"] + filler(84, 1, 60))
    k = r["kvc"]
    check(k["decode_worker"] == 1 - x and k["migrated_from"] == x and k["migrated"] and
          k["mode"] == "direct",
          f"the drained instance's session moved with its KV: {k}")
    http(gateway + f"/admin/instances/{x}/resume", {})
    print("drain: a session on a drained instance moved with its KV")

    # A failure after the headers went out is an error event, then [DONE].
    doomed_prompt = filler(81, 0, 300)
    r = completion(gateway, "doomed", doomed_prompt)
    home = r["kvc"]["decode_worker"]
    other = 1 - home
    # A session on the other instance (home drained meanwhile, so it goes
    # there), to be moved onto the stopped one below.
    http(gateway + f"/admin/instances/{home}/drain", {})
    refugee_prompt = filler(85, 0, 200)
    refugee = completion(gateway, "refugee", refugee_prompt)
    http(gateway + f"/admin/instances/{home}/resume", {})
    check(refugee["kvc"]["decode_worker"] == other,
          f"a new session avoids the drained instance: {refugee['kvc']}")
    iprocs[home].terminate()
    iprocs[home].wait(timeout=10)
    chunks = stream("/v1/completions",
                    {"prompt": doomed_prompt + r["choices"][0]["text"] + filler(81, 1, 100),
                     "max_tokens": 8, "stream": True}, session="doomed")
    check(len(chunks) == 1 and chunks[0][1]["error"]["code"] == 502 and
          "worker-unavailable" in chunks[0][1]["error"]["message"],
          f"the stopped instance's failure reached the client as an event: {chunks}")
    print("streamed: completion and chat as they decode; a failure as an error event")

    # Two more calls it never answers open its circuit breaker: nothing goes
    # there while it is open, and the session bound there is placed anew.
    # The second is a KV move: the other instance drained, the refugee's KV
    # moves to the stopped one, which never answers the move (counted
    # against it); the turn is not run there but answered 503 at once.
    try:
        completion(gateway, "doomed", doomed_prompt + filler(81, 2, 50))
        check(False, "a turn on the stopped instance fails")
    except urllib.error.HTTPError as e:
        check(e.code == 502, f"a turn on the stopped instance: HTTP {e.code}")
    failed_moves = parse_metrics(http(gateway + "/metrics")[1])[
        'kvc_session_migrations_total{status="error"}']
    http(gateway + f"/admin/instances/{other}/drain", {})
    try:
        completion(gateway, "refugee",
                   refugee_prompt + refugee["choices"][0]["text"] + filler(85, 9, 50))
        check(False, "a turn moved onto the stopped instance fails")
    except urllib.error.HTTPError as e:
        check(e.code == 503 and e.headers.get("Retry-After") == "1",
              f"a turn whose KV move got no answer: HTTP {e.code}, retry {e.headers.get('Retry-After')}")
    http(gateway + f"/admin/instances/{other}/resume", {})
    poll_metrics(gateway, lambda m: (
        m['kvc_session_migrations_total{status="error"}'] == failed_moves + 1 and
        m[f'kvc_instance_routable{{worker="{home}"}}'] == 0 and
        m[f'kvc_instance_breaker_openings_total{{worker="{home}"}}'] == 1),
        "the stopped instance's breaker opened (the failed KV move counted)")
    check(http(gateway + "/debug/index")[1]["instances"][home]["breaker"] == "open",
          "/debug/index shows the open breaker")
    r = completion(gateway, "doomed", doomed_prompt + filler(81, 9, 50))
    check(r["kvc"]["decode_worker"] == other,
          f"the session bound to the stopped instance is served by the other: {r['kvc']}")
    r = completion(gateway, "newcomer", filler(83, 0, 200))
    check(r["kvc"]["decode_worker"] == other,
          f"a new session avoids the stopped (idle-looking) instance: {r['kvc']}")
    print("circuit breaker: a stopped instance is left alone; its session moved on")

    # An operator drains the instance left: with nothing routable a turn gets
    # 503 and Retry-After; resumed, it serves again.
    _, drained = http(gateway + f"/admin/instances/{other}/drain", {})
    check(drained == {"instance": other, "drained": True}, f"drain answer: {drained}")
    check(parse_metrics(http(gateway + "/metrics")[1])[f'kvc_instance_routable{{worker="{other}"}}'] == 0,
          "a drained instance is not routable")
    try:
        completion(gateway, "newcomer", filler(83, 1, 100))
        check(False, "a turn with no routable instance is refused")
    except urllib.error.HTTPError as e:
        message = json.loads(e.read().decode())["error"]["message"]
        check(e.code == 503 and e.headers.get("Retry-After") == "1" and "routable" in message,
              f"no routable instance: HTTP {e.code} {message}")
    http(gateway + f"/admin/instances/{other}/resume", {})
    r = completion(gateway, "newcomer", filler(83, 2, 100))
    check(r["kvc"]["decode_worker"] == other, f"served again once resumed: {r['kvc']}")
    for instance, code in (("7", 404), ("x", 400)):
        try:
            http(gateway + f"/admin/instances/{instance}/drain", {})
            check(False, f"draining instance {instance!r} is refused")
        except urllib.error.HTTPError as e:
            check(e.code == code, f"drain {instance!r}: HTTP {e.code}")
    print("drain: nothing new goes to a drained instance; resumed, it serves again")

    # An instance joins at runtime: the gateway sends it turns and KV moves.
    for body in ({"url": 7}, {"address": "x"}, {"url": "127.0.0.1:1"}):
        try:
            http(gateway + "/admin/instances", body)
            check(False, f"joining with {body} is refused")
        except urllib.error.HTTPError as e:
            check(e.code == 400, f"join with {body}: HTTP {e.code}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Nothing answers there yet: refused, nothing grows.
    try:
        http(gateway + "/admin/instances", {"url": url})
        check(False, "joining an instance that does not answer is refused")
    except urllib.error.HTTPError as e:
        message = json.loads(e.read().decode())["error"]["message"]
        check(e.code == 502 and "/health" in message, f"join of a dead URL: HTTP {e.code} {message}")
    proc = start("instance2", [args.emulator, "--role", "instance", "--port", str(port)] + common)
    wait_healthy(url, proc)
    _, joined = http(gateway + "/admin/instances", {"url": url})
    check(joined == {"instance": 2, "url": url}, f"join answer: {joined}")
    for again in (url, instances[other]):
        try:
            http(gateway + "/admin/instances", {"url": again})
            check(False, f"joining {again} twice is refused")
        except urllib.error.HTTPError as e:
            check(e.code == 409, f"join of {again} again: HTTP {e.code}")
    poll_metrics(gateway, lambda m: m['kvc_instance_routable{worker="2"}'] == 1,
                 "the new instance is routable")
    check(len(http(gateway + "/debug/index")[1]["instances"]) == 3, "/debug/index lists three")
    # The only other live instance drained: its session moves to the
    # newcomer with its KV, and a new session starts there.
    r = completion(gateway, "newcomer", filler(83, 3, 100))
    check(r["kvc"]["decode_worker"] == other, f"newcomer still at home: {r['kvc']}")
    http(gateway + f"/admin/instances/{other}/drain", {})
    r = completion(gateway, "newcomer", filler(83, 3, 100) + r["choices"][0]["text"] +
                   filler(83, 4, 50))
    k = r["kvc"]
    check(k["decode_worker"] == 2 and k["migrated_from"] == other and k["migrated"] and
          k["mode"] == "direct", f"the drained instance's session moved to the newcomer: {k}")
    r = completion(gateway, "late", filler(86, 0, 100))
    check(r["kvc"]["decode_worker"] == 2, f"a new session starts on the newcomer: {r['kvc']}")
    http(gateway + f"/admin/instances/{other}/resume", {})
    print("join: an instance added at runtime takes moved and new sessions")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--emulator", required=True)
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--scenario", choices=["kvc", "ear"], default="kvc")
    args = parser.parse_args()

    for attempt in range(3):
        try:
            return run_scenario(args)
        except PortTaken as e:
            print(f"restarting the scenario on fresh ports: {e}", file=sys.stderr)
    raise AssertionError("three attempts lost a port to another process")


def run_scenario(args):
    procs = []
    logdir = tempfile.mkdtemp(prefix="kvc-e2e-")

    def start(name, cmd):
        path = os.path.join(logdir, name + ".log")
        log = open(path, "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        LOG_OF[proc.pid] = path
        procs.append((name, proc, log))
        return proc

    try:
        rc = run_ear(args, start) if args.scenario == "ear" else run_kvc(args, start)
    except PortTaken:
        raise
    except Exception:
        for name, _, logf in procs:
            logf.flush()
            with open(os.path.join(logdir, name + ".log")) as f:
                sys.stderr.write(f"--- {name} log (tail)\n" + "".join(f.readlines()[-20:]))
        raise
    finally:
        for _, proc, logf in procs:
            if proc.poll() is None:
                proc.terminate()
        for _, proc, logf in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
            logf.close()
    # Sanitized binaries report into their logs; a report fails the test.
    for name, _, _ in procs:
        with open(os.path.join(logdir, name + ".log")) as f:
            text = f.read()
        for marker in ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer", "runtime error:"):
            check(marker not in text, f"{name}: {marker} (log {logdir}/{name}.log)")
    return rc


if __name__ == "__main__":
    sys.exit(main())
