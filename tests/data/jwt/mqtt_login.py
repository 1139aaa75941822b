"""An unmodified paho-mqtt client for tests/jwt.rs: CONNECT as UID with TOKEN as the
password, over MQTT 3.1.1 or 5, then prints "rc <CONNACK code>" and disconnects.

    mqtt_login.py HOST PORT UID TOKEN 3|5
"""
import sys
import threading

import paho.mqtt.client as mqtt

host, port, uid, token, version = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
protocol = mqtt.MQTTv5 if version == "5" else mqtt.MQTTv311
done = threading.Event()
try:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="jwt", protocol=protocol)
except AttributeError:  # paho 1.6
    client = mqtt.Client(client_id="jwt", protocol=protocol)
client.username_pw_set(uid, token)


def on_connect(client, userdata, flags, reason, properties=None):
    code = reason.value if hasattr(reason, "value") else int(reason)
    print("rc", code, flush=True)
    done.set()


client.on_connect = on_connect
try:
    client.connect(host, port, keepalive=10)
except Exception as e:  # the gateway closing at once
    print("error", type(e).__name__, flush=True)
    sys.exit(0)
client.loop_start()
if not done.wait(10):
    print("no connack", flush=True)
client.disconnect()
client.loop_stop()
