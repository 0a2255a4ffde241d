#!/usr/bin/env python3
"""Sends `braid batch` input lines to a running server over HTTP, in order, CONCURRENCY at a time.

    replay_batch_http.py URL INPUT.jsonl OUTPUT.jsonl [CONCURRENCY]

Each line's prompt (or messages), max_tokens, tenant, workflow_id, agent and directives go in a
/v1/completions (or /v1/chat/completions) request, greedy; each result line holds the id, the HTTP
status, the usage numbers (as `braid batch` names them) and the directive outcomes. Exits non-zero
when any request did not get a 200.
"""
import concurrent.futures as cf
import json
import sys
import urllib.error
import urllib.request


def send(url, line):
    body = {k: line[k] for k in ("prompt", "messages", "max_tokens", "tenant", "workflow_id", "agent", "directives") if line.get(k)}
    body["temperature"] = 0
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=1800) as r:
            status, out = r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        status, out = e.code, json.loads(e.read())
    row = {"id": line.get("id"), "status": status, "tenant": line.get("tenant")}
    if status == 200:
        u = out["usage"]
        d = u.get("prompt_tokens_details", {})
        row.update(prompt_tokens=u["prompt_tokens"], cached_tokens=d.get("cached_tokens", 0),
                   segment_reused_tokens=d.get("segment_reused_tokens", 0), directive_outcomes=out.get("directive_outcomes"))
    else:
        row["error"] = out.get("error")
    return row


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    url, inp, outp = sys.argv[1], sys.argv[2], sys.argv[3]
    conc = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    lines = [json.loads(l) for l in open(inp) if l.strip()]
    with cf.ThreadPoolExecutor(max_workers=conc) as pool:
        rows = list(pool.map(lambda l: send(url, l), lines))
    with open(outp, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    bad = [r for r in rows if r["status"] != 200]
    if bad:
        sys.exit(f"{len(bad)} requests failed, e.g. {bad[0]}")


if __name__ == "__main__":
    main()
