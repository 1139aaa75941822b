#!/usr/bin/env python3
"""Screenshots the status page of a running gateway after watching it live for a while.

    python3 docs/status-screenshot.py [http://127.0.0.1:7071/] [seconds] [out.png]

Writes status-page.png in the current folder unless told where (the README's image,
docs/images/status-page.png, is replaced only when named). Needs Debian's chromium
(`apt-get install chromium`) and `pip install websocket-client`. Headless chromium keeps the page
open for `seconds` of real time (so the sparkline has history), then the DevTools protocol
captures it.
"""
import base64, json, re, subprocess, sys, tempfile, time, urllib.request
import websocket

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:7071/"
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60
out = sys.argv[3] if len(sys.argv) > 3 else "status-page.png"
if subprocess.run(["sh", "-c", "command -v chromium"], capture_output=True).returncode != 0:
    sys.exit("status-screenshot.py needs chromium: apt-get install chromium")
profile = tempfile.mkdtemp()
browser = subprocess.Popen(
    ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
     "--disable-background-networking", "--disable-component-update", "--disable-sync",
     "--remote-debugging-port=0", "--window-size=1280,800", f"--user-data-dir={profile}", "about:blank"],
    stderr=subprocess.PIPE, text=True)
try:
    for line in browser.stderr:
        m = re.search(r"DevTools listening on ws://([^/]+)/", line)
        if m:
            break
    req = urllib.request.Request(f"http://{m.group(1)}/json/new?{url}", method="PUT")
    target = json.load(urllib.request.urlopen(req))
    ws = websocket.create_connection(target["webSocketDebuggerUrl"])
    time.sleep(seconds)
    ws.send(json.dumps({"id": 1, "method": "Page.captureScreenshot", "params": {"format": "png"}}))
    while True:
        reply = json.loads(ws.recv())
        if reply.get("id") == 1:
            break
    open(out, "wb").write(base64.b64decode(reply["result"]["data"]))
    print(f"wrote {out}")
finally:
    browser.kill()
