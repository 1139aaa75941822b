#!/usr/bin/env python3
"""MQTT clients held to their own keepalive, measured from outside (issue 50): each client
connects with its keepalive K, then falls silent, and the gateway must close it after more
than its class less a tick of silence and at most its class, which is at most 1.5 K
([MQTT-3.1.2-24]).

    loadtest/mqtt-keepalive.py [gateway binary] > out.txt
                        (default target/release/idlegate; about 100 s: the 60 s clients)

The clients, side by side, on one gateway with its default classes and a 1 s tick:
- paho-mqtt (MQTT 3.1.1) at keepalive 5 s and 60 s: it connects, then stops its network
  loop, so it sends nothing more. Its silence runs from its CONNECT leaving to the socket
  closing, both read on the client's side.
- mosquitto_sub (Debian's, MQTT 3.1.1 and 5) with its default keepalive (60 s), stopped with
  SIGSTOP once the gateway lists it. Its silence runs from its login (`since_ms` of
  `GET /v1/presence/{uid}`: the CONNECT's arrival) to the moment the presence answers
  offline (polled every 50 ms, so up to 50 ms late, never early).

Each line: the client, K, the class the gateway granted (the presence's `timeout_ms`), the
window (class - tick, class], the silence measured, and whether it lies in the window and
within 1.5 K. Exits 1 if any does not.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import paho.mqtt.client as mqtt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gateway_process  # noqa: E402

TICK_S = 1.0
# How often the presence is polled, and so how late a measured end may be.
POLL_S = 0.05


def presence(api, uid):
    with urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/presence/{uid}", timeout=5) as r:
        return json.load(r)


def paho_client(port, api, uid, keepalive, results):
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"paho-{uid}", protocol=mqtt.MQTTv311)
    c.username_pw_set(str(uid))
    connected = threading.Event()
    c.on_connect = lambda *a: connected.set()
    sent = time.time()
    c.connect("127.0.0.1", port, keepalive=keepalive)
    while not connected.is_set():
        c.loop(timeout=0.1)
    # From here the loop is never run again: no PINGREQ, nothing at all.
    class_ms = presence(api, uid)["sessions"][0]["timeout_ms"]
    sock = c.socket()
    sock.setblocking(True)
    sock.settimeout(None)
    try:
        while sock.recv(4096):
            pass
    except OSError:
        pass
    closed = time.time()
    results.append(("paho 3.1.1", keepalive, class_ms, closed - sent))


def mosquitto_client(port, api, uid, version, results):
    # Default keepalive: mosquitto_sub's own (60 s).
    p = subprocess.Popen(
        ["mosquitto_sub", "-h", "127.0.0.1", "-p", str(port), "-u", str(uid), "-i", f"mosq-{uid}",
         "-V", version, "-t", "t"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            answer = presence(api, uid)
            if answer["online"] and answer["sessions"]:
                break
            time.sleep(POLL_S)
        os.kill(p.pid, signal.SIGSTOP)
        session = answer["sessions"][0]
        since = session["since_ms"] / 1000.0
        while presence(api, uid)["online"]:
            time.sleep(POLL_S)
        ended = time.time()
        results.append((f"mosquitto_sub {version}", 60, session["timeout_ms"], ended - since))
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else "target/release/idlegate"
    port, admin, api = (gateway_process.free_port() for _ in range(3))
    gw = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{gateway_process.free_port()}",
         "--admin-listen", f"127.0.0.1:{admin}", "--api-listen", f"127.0.0.1:{api}",
         "--mqtt-listen", f"127.0.0.1:{port}", "--tick", "1s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = []
    try:
        gateway_process.wait_port(port)
        gateway_process.wait_port(api)
        runs = [
            threading.Thread(target=paho_client, args=(port, api, 501, 5, results)),
            threading.Thread(target=paho_client, args=(port, api, 502, 60, results)),
            threading.Thread(target=mosquitto_client, args=(port, api, 503, "mqttv311", results)),
            threading.Thread(target=mosquitto_client, args=(port, api, 504, "mqttv5", results)),
        ]
        for t in runs:
            t.start()
        for t in runs:
            t.join()
    finally:
        gw.terminate()
        gw.wait()
    print("# loadtest/mqtt-keepalive.py: silent MQTT clients, gateway --tick 1s, default classes")
    print("# client keepalive_s class_s window_s silence_s in_window within_1.5K")
    bad = 0
    for name, keep, class_ms, silence in sorted(results, key=lambda r: (r[1], r[0])):
        cls = class_ms / 1000.0
        in_window = cls - TICK_S < silence <= cls + POLL_S
        within = silence <= 1.5 * keep + POLL_S
        bad += not (in_window and within)
        print(f"{name:<24} {keep:>3} {cls:>7.1f} ({cls - TICK_S:.1f}, {cls:.1f}] {silence:>8.3f} "
              f"{'yes' if in_window else 'NO':>4} {'yes' if within else 'NO':>4}")
    if len(results) != 4:
        print(f"only {len(results)} of 4 clients measured", file=sys.stderr)
        bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
