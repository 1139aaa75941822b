#!/usr/bin/env python3
"""A hundred status pages, as browsers would hold them, against a gateway's admin listener:
each page keeps one event stream open and polls /status.json once a second, over a
keep-alive connection of its own. Runs until killed.

    python3 loadtest/pages.py [HOST:PORT] [PAGES]
"""
import http.client
import sys
import threading
import time

host, port = (sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7071").split(":")
pages = int(sys.argv[2]) if len(sys.argv) > 2 else 100


def follow():
    conn = http.client.HTTPConnection(host, int(port))
    conn.request("GET", "/v1/events?types=online,offline")
    response = conn.getresponse()
    while response.read1(65536):
        pass


def poll():
    conn = http.client.HTTPConnection(host, int(port))
    while True:
        conn.request("GET", "/status.json")
        conn.getresponse().read()
        time.sleep(1)


for _ in range(pages):
    threading.Thread(target=follow, daemon=True).start()
    threading.Thread(target=poll, daemon=True).start()
while True:
    time.sleep(60)
