"""An unmodified paho-mqtt client for tests/mqtt.rs: MQTT 5, uid and token as username and
password, a keepalive of 60 s that the gateway's Server Keep Alive shortens.

    paho_client.py HOST PORT UID IDLE_SECONDS [tcp|websockets]

Over websockets it connects to the WebSocket door's /v1/ws, offering the `mqtt` subprotocol.

It asks for a session that outlives the connection by an hour (Session Expiry Interval
3600), which the gateway does not keep and must say so in CONNACK.

Prints one line per step: "connected <server keep alive> <session expiry interval>",
"published", "push <payload>",
then, after IDLE_SECONDS without a packet of its own, "alive" if still connected, and
disconnects cleanly.
"""
import sys
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

host, port, uid, idle = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
transport = sys.argv[5] if len(sys.argv) > 5 else "tcp"
pushed = threading.Event()
connected = threading.Event()

try:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho", protocol=mqtt.MQTTv5,
                         transport=transport)
except AttributeError:  # paho 1.6
    client = mqtt.Client(client_id="paho", protocol=mqtt.MQTTv5, transport=transport)
if transport == "websockets":
    client.ws_set_options(path="/v1/ws")
client.username_pw_set(uid, "token")


def on_connect(client, userdata, flags, reason, properties=None):
    keep = getattr(properties, "ServerKeepAlive", None)
    expiry = getattr(properties, "SessionExpiryInterval", None)
    print("connected", keep, expiry, flush=True)
    client.subscribe("idlegate/#", qos=0)
    connected.set()


def on_message(client, userdata, message):
    print("push", message.payload.decode(), flush=True)
    pushed.set()


client.on_connect = on_connect
client.on_message = on_message
asked = Properties(PacketTypes.CONNECT)
asked.SessionExpiryInterval = 3600
client.connect(host, port, keepalive=60, clean_start=True, properties=asked)
client.loop_start()
if not connected.wait(10):
    sys.exit("no CONNACK")
client.publish("sensors/paho", b"from paho", qos=1).wait_for_publish(10)
print("published", flush=True)
if not pushed.wait(20):
    sys.exit("no push")
time.sleep(idle)
print("alive" if client.is_connected() else "dropped", flush=True)
client.disconnect()
client.loop_stop()
