"""Driven by python_test.go: the ingress through Python's HTTP stacks, httpx (h11 underneath, as the official
openai Python client uses it) and aiohttp, each with its own strict HTTP/1.1 parser; prints one JSON object.

Every check reports what it saw; the Go test decides. A check that raises reports {"error": true, "message": ...}.
"""
import asyncio
import json
import os
import sys

import aiohttp
import httpx

BASE = os.environ["KVMESH_BASE_URL"]
MODEL = os.environ["KVMESH_MODEL"]
out = {}


def capture(name, fn):
    try:
        out[name] = fn()
    except Exception as e:  # reported, not raised: the Go test names the check
        out[name] = {"error": True, "message": f"{type(e).__name__}: {e}"}


def sse(lines):
    """Parses an event stream's lines: the JSON events and whether [DONE] ended it."""
    events, done = [], False
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if done:
            raise ValueError(f"data after [DONE]: {line!r}")
        if not line.startswith("data: "):
            raise ValueError(f"not an event line: {line!r}")
        if line == "data: [DONE]":
            done = True
            continue
        events.append(json.loads(line[len("data: "):]))
    return events, done


def stream_result(events, done):
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    usage = [e["usage"] for e in events if e.get("usage")]
    return {"events": len(events), "done": done, "text": text, "usage": usage[-1] if usage else None,
            "usage_events": len(usage)}


client = httpx.Client(base_url=BASE, timeout=30)


def httpx_stream():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 9, "stream": True,
            "stream_options": {"include_usage": True}}
    with client.stream("POST", "/chat/completions", json=body) as r:
        r.raise_for_status()
        ctype = r.headers.get("content-type", "")
        events, done = sse(r.iter_lines())
    return {**stream_result(events, done), "content_type": ctype}


def httpx_chat():
    r = client.post("/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                                              "max_tokens": 7})
    r.raise_for_status()
    b = r.json()
    return {"text": b["choices"][0]["message"]["content"], "usage": b["usage"]}


def httpx_completions():
    r = client.post("/completions", json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5})
    r.raise_for_status()
    b = r.json()
    return {"text": b["choices"][0]["text"], "usage": b["usage"]}


def httpx_error():
    r = client.post("/chat/completions", json={"model": MODEL, "messages": []})
    return {"status": r.status_code, "body": r.json()}


def httpx_keepalive():
    statuses = [client.post("/completions", json={"model": MODEL, "prompt": f"request {i}", "max_tokens": 2}).status_code
                for i in range(20)]
    return {"ok": sum(s == 200 for s in statuses), "sent": len(statuses)}


async def aiohttp_streams():
    async with aiohttp.ClientSession() as s:
        async def one(i):
            body = {"model": MODEL, "prompt": f"story {i}", "max_tokens": 4, "stream": True,
                    "stream_options": {"include_usage": True}}
            async with s.post(BASE + "/completions", json=body) as r:
                r.raise_for_status()
                lines = [line.decode() async for line in r.content]
            events, done = sse(lines)
            text = "".join(c["text"] for e in events for c in e["choices"])
            usage = [e["usage"] for e in events if e.get("usage")]
            return done and text != "" and len(usage) == 1 and usage[0]["completion_tokens"] == 4
        ok = await asyncio.gather(*[one(i) for i in range(32)])
    return {"ok": sum(ok), "sent": len(ok)}


capture("httpx_stream", httpx_stream)
capture("httpx_chat", httpx_chat)
capture("httpx_completions", httpx_completions)
capture("httpx_error", httpx_error)
capture("httpx_keepalive", httpx_keepalive)
capture("aiohttp_streams", lambda: asyncio.run(aiohttp_streams()))
client.close()
json.dump(out, sys.stdout)
