"""A KV-event subscriber written against vLLM's published schema (vllm/distributed/kv_events.py),
used by test_kv_events.sh to check what `braid serve --kv-events-endpoint` publishes.

    kv_events_subscriber.py listen PUB_EP OUT.json READY_FILE STOP_FILE TOPIC DROP
        Subscribes to TOPIC, touches READY_FILE, and records every message [topic, seq, payload]
        until STOP_FILE exists and nothing arrived for a second. Sequence numbers in DROP (comma
        list) are treated as lost: kept aside, not delivered. Then asks REPLAY (argv[7]) for the
        batches from the first lost one on. Writes {"seen": [...], "dropped": [...], "replayed": [...]}.
    kv_events_subscriber.py replay REPLAY_EP START OUT.json
        A late subscriber: asks the replay socket for every batch from START.

Wire (vLLM's ZmqEventPublisher): PUB frames [topic, seq as 8-byte big-endian, msgpack payload];
replay: send [b"", start seq] on a DEALER (the envelope a REQ adds), receive [b"", seq, payload]
per batch until seq == -1. Payload: KVEventBatch as msgspec encodes array-like tagged structs,
[ts, [events...], data_parallel_rank]; events ["BlockStored", block_hashes, parent_block_hash,
token_ids, block_size, lora_id, medium, lora_name], ["BlockRemoved", block_hashes, medium],
["AllBlocksCleared"].
"""
import json
import os
import sys
import time

import msgpack
import zmq

END_SEQ = -1


def decode_batch(payload):
    batch = msgpack.unpackb(payload, raw=False)
    ts, events = batch[0], batch[1]
    rank = batch[2] if len(batch) > 2 else None
    out = []
    for ev in events:
        tag = ev[0]
        if tag == "BlockStored":
            hashes, parent, tokens, block_size, lora_id, medium = ev[1:7]
            lora_name = ev[7] if len(ev) > 7 else None
            out.append({"type": tag, "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                        "block_size": block_size, "lora_id": lora_id, "medium": medium, "lora_name": lora_name})
        elif tag == "BlockRemoved":
            out.append({"type": tag, "block_hashes": ev[1], "medium": ev[2]})
        elif tag == "AllBlocksCleared":
            out.append({"type": tag})
        else:
            raise ValueError(f"unknown event tag {tag!r}")
    return {"ts": ts, "events": out, "data_parallel_rank": rank}


def record(seq, payload):
    return {"seq": seq, "payload": payload.hex(), "batch": decode_batch(payload)}


def replay(ctx, endpoint, start):
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.connect(endpoint)
    sock.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
    got = []
    while True:
        frames = sock.recv_multipart()
        assert len(frames) == 3 and frames[0] == b"", f"replay frames {frames!r}"
        seq = int.from_bytes(frames[1], "big", signed=True)
        if seq == END_SEQ:
            assert frames[2] == b""
            break
        got.append(record(seq, frames[2]))
    sock.close()
    return got


def listen(pub_ep, out_path, ready_file, stop_file, topic, drop, replay_ep):
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(pub_ep)
    time.sleep(0.5)  # a PUB drops what it sends before the subscription reaches it
    open(ready_file, "w").close()
    seen, dropped = [], []
    last = time.monotonic()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if sub.poll(100):
            t, seq_bytes, payload = sub.recv_multipart()
            assert t == topic.encode(), f"topic {t!r}"
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            (dropped if seq in drop else seen).append(record(seq, payload))
            last = time.monotonic()
        elif os.path.exists(stop_file) and time.monotonic() - last > 1.0:
            break
    replayed = replay(ctx, replay_ep, min(drop)) if drop and replay_ep else []
    json.dump({"seen": seen, "dropped": dropped, "replayed": replayed}, open(out_path, "w"))
    ctx.destroy(linger=0)


def main():
    if sys.argv[1] == "listen":
        pub_ep, out_path, ready_file, stop_file, topic, drop = sys.argv[2:8]
        replay_ep = sys.argv[8] if len(sys.argv) > 8 else None
        listen(pub_ep, out_path, ready_file, stop_file, topic, {int(s) for s in drop.split(",") if s}, replay_ep)
    elif sys.argv[1] == "replay":
        ctx = zmq.Context()
        json.dump(replay(ctx, sys.argv[2], int(sys.argv[3])), open(sys.argv[4], "w"))
        ctx.destroy(linger=0)
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")


if __name__ == "__main__":
    main()
