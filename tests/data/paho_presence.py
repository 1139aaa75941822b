"""An unmodified paho-mqtt client watching presence, for tests/mqtt_presence.rs: MQTT 5 (or
3.1.1), uid and token as username and password.

    paho_presence.py HOST PORT UID WATCHED COUNT [mqttv5|mqttv311] [tcp|websockets]

Subscribes to idlegate/presence/WATCHED, publishes its own status "paho here" to
idlegate/status at QoS 1 and waits for the PUBACK, then prints each presence message's
payload on a line of its own ("published" once the status is acknowledged) until COUNT
messages came, and disconnects cleanly.
"""
import os
import sys
import threading

import paho.mqtt.client as mqtt

host, port, uid, watched, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
version = mqtt.MQTTv5 if (sys.argv[6] if len(sys.argv) > 6 else "mqttv5") == "mqttv5" else mqtt.MQTTv311
transport = sys.argv[7] if len(sys.argv) > 7 else "tcp"
subscribed = threading.Event()
done = threading.Event()
got = []

client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-watcher", protocol=version, transport=transport)
if transport == "websockets":
    client.ws_set_options(path="/v1/ws")
client.username_pw_set(uid, "token")


def on_connect(client, userdata, flags, reason, properties=None):
    client.subscribe(f"idlegate/presence/{watched}", qos=0)


def on_subscribe(client, userdata, mid, reasons, properties=None):
    codes = [getattr(r, "value", r) for r in reasons]
    if any(c >= 0x80 for c in codes):
        # From paho's thread: exit the whole process, not just the thread.
        print(f"SUBACK refused: {codes}", file=sys.stderr, flush=True)
        os._exit(3)
    subscribed.set()


def on_message(client, userdata, message):
    print(message.payload.decode(), flush=True)
    got.append(message)
    if len(got) >= count:
        done.set()


client.on_connect = on_connect
client.on_subscribe = on_subscribe
client.on_message = on_message
client.connect(host, port, keepalive=20)
client.loop_start()
if not subscribed.wait(10):
    sys.exit("no SUBACK")
client.publish("idlegate/status", b"paho here", qos=1).wait_for_publish(10)
print("published", flush=True)
if not done.wait(30):
    sys.exit(f"only {len(got)} of {count} presence messages")
client.disconnect()
client.loop_stop()
