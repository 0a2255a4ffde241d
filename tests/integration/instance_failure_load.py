#!/usr/bin/env python3
"""Load and kill for test_instance_failure.sh, section 1: one process, so the timing does not hang on
forking curl under a loaded CPU.

  instance_failure_load.py URL EVENTS_JSONL VICTIM_PID OUT_JSON

Sends rounds of 12 concurrent completions (160 tokens each; half streamed, half whole), all at once
so both instances get work. It SIGKILLs VICTIM_PID (instance 1's only rank) at the first moment when
instance 1 is running, unfinished, both a stream that has sent text and a whole answer (it knows the
instance of each request from the `route` lines of --events, and a stream's request id from its first
chunk). If a round finishes before that moment came (a slow machine can finish 160 tokens before the
monitor looks), it sends another round, up to three. OUT_JSON gets, for every request of the round
that saw the kill: stream or not, HTTP status, the body, the request id, the instance it was first
routed to, and whether it was still running when the kill was sent. Exits 1 if no round gave the
moment."""
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

URL, EVENTS, VICTIM, OUT = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ROUNDS, PER_ROUND, TOKENS = 3, 12, 160


class Request(threading.Thread):
    def __init__(self, number, stream):
        super().__init__(daemon=True)
        self.number, self.stream = number, stream
        self.status, self.body, self.req_id, self.has_text, self.done = None, "", None, False, False

    def run(self):
        prompt = f"Story number {self.number}: once upon a time, in a land far away,"
        data = json.dumps({"prompt": prompt, "max_tokens": TOKENS, "ignore_eos": True, "temperature": 0,
                           "stream": self.stream}).encode()
        request = urllib.request.Request(URL + "/v1/completions", data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as answer:
                self.status = answer.status
                if self.stream:
                    for raw in answer:
                        line = raw.decode()
                        self.body += line
                        self.note_chunk(line)
                else:
                    self.body = answer.read().decode()
                    self.req_id = id_of(self.body)
        except urllib.error.HTTPError as error:
            self.status, self.body = error.code, error.read().decode()
        except Exception as error:  # a dropped connection: the test fails on status None
            self.body += f"\n(client error: {error!r})"
        self.done = True

    def note_chunk(self, line):
        if not line.startswith("data: {"):
            return
        if self.req_id is None:
            self.req_id = id_of(line)
        if '"text":"' in line.replace('"text":""', ""):
            self.has_text = True


def id_of(text):
    marker = '"id":"cmpl-'
    return int(text.split(marker)[1].split('"')[0]) if marker in text else None


def first_routes():
    routes = {}
    try:
        with open(EVENTS) as events:
            for line in events:
                if '"event":"route"' in line:
                    event = json.loads(line)
                    routes.setdefault(event["req"], event["instance"])
    except (OSError, ValueError):
        pass
    return routes


def kill_moment(requests, before):
    """True when instance 1 runs an unfinished stream with text and an unfinished whole answer
    (request ids grow: this round's are those above `before`)."""
    streams = [r for r in requests if r.stream]
    if any(r.req_id is None and not r.done for r in streams):
        return False  # a stream without its id yet could be mistaken for a whole answer
    routes = first_routes()
    stream_ids = {r.req_id for r in streams}
    finished_ids = {r.req_id for r in requests if r.done}
    stream_on_1 = any(not r.done and r.has_text and routes.get(r.req_id) == 1 for r in streams)
    whole_on_1 = any(instance == 1 and req > before and req not in stream_ids and req not in finished_ids
                     for req, instance in routes.items())
    return stream_on_1 and whole_on_1


def one_round(round_number):
    before = max(first_routes(), default=0)
    requests = [Request(round_number * 100 + i, i % 4 in (2, 3)) for i in range(1, PER_ROUND + 1)]
    for r in requests:
        r.start()
        time.sleep(0.05)  # in order, so the least-loaded router alternates between the instances
    while not all(r.done for r in requests):
        if kill_moment(requests, before):
            running = {r.number for r in requests if not r.done}
            os.kill(VICTIM, signal.SIGKILL)
            print(f"round {round_number}: killed pid {VICTIM} with {len(running)} requests running", flush=True)
            return requests, running
        time.sleep(0.05)
    print(f"round {round_number}: finished before instance 1 ran both kinds at once; again", flush=True)
    return requests, None


def main():
    for round_number in range(1, ROUNDS + 1):
        requests, running = one_round(round_number)
        if running is not None:
            for r in requests:
                r.join(timeout=320)
            routes = first_routes()
            report = [{"number": r.number, "stream": r.stream, "status": r.status, "body": r.body,
                       "req": r.req_id, "instance": routes.get(r.req_id), "running_at_kill": r.number in running}
                      for r in requests]
            with open(OUT, "w") as out:
                json.dump(report, out)
            return 0
    print("no round had instance 1 running a stream with text and a whole answer at once", flush=True)
    return 1


sys.exit(main())
