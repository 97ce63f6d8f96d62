#!/usr/bin/env python3
"""check_trace.py TRACE.json --ranks N [--steps S] [--buckets] [--step-slack K]

Checks a merged timeline (docs/observability.md) the way a viewer would read it:
  - it is valid JSON (and valid UTF-8) in Chrome's trace event format:
    traceEvents with ph, pid, tid, ts (and dur for X), a process "rank R" per
    rank (never pid 0: Perfetto's idle process) and a name per thread;
  - the spans of every track nest (a span that begins inside another ends
    inside it);
  - every rank has the same number of "step" spans (S when given; within K of
    each other with --step-slack K, for a run that was stopped mid-step);
  - with --buckets: on every rank, the k-th all-reduce of DDP bucket b was
    enqueued and started no earlier than the k-th "bucket b ready", and every
    rank ran as many;
  - the clocks are aligned: a collective of sequence number n ends on every
    rank after it started on every rank (an all-reduce needs every rank's data),
    to within the clock errors the ranks recorded plus 1 ms;
  - flow arrows are bound to slices ("bind_id" on X events, as Perfetto binds
    them whatever the order of the file): each arrow has one slice it leaves
    and one it enters, no later; an arrow that leaves "enqueue <op> (<label>)"
    (a slice of non-zero duration) enters "<op> (<label>)" of the same rank and
    sequence number.
Exits 1 with the first failure printed; prints a summary line on success.
"""
import argparse
import collections
import json
import re
import sys

EPS_US = 0.002  # the merge writes microseconds with 3 decimals


def fail(message):
    print(f"check_trace.py: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def load(path):
    try:
        with open(path, encoding="utf-8", errors="strict") as f:
            trace = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path} is not valid UTF-8 JSON: {e}")
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        fail("no traceEvents list")
    for e in trace["traceEvents"]:
        for key in ("ph", "pid", "tid", "name"):
            if key not in e:
                fail(f"an event lacks '{key}': {e}")
        if e["ph"] != "M" and not isinstance(e.get("ts"), (int, float)):
            fail(f"an event lacks a numeric ts: {e}")
        if e["ph"] == "X" and not (isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0):
            fail(f"a span lacks a dur >= 0: {e}")
    return trace


def check_metadata(events, ranks):
    """Returns {pid: rank} from the process names, and rewrites each event's pid
    as its rank ("rank" key) for the checks below."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    if 0 in names:
        fail("a process has pid 0, which Perfetto takes for the idle process")
    rank_of = {}
    for pid, name in names.items():
        m = re.fullmatch(r"rank (\d+)", name)
        if not m:
            fail(f"process {pid} is named '{name}', not 'rank R'")
        rank_of[pid] = int(m.group(1))
    for r in range(ranks):
        if r not in rank_of.values():
            fail(f"no process 'rank {r}' (process names: {names})")
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    for e in events:
        if e["pid"] not in rank_of:
            fail(f"an event of pid {e['pid']}, which has no process name: {e}")
        e["rank"] = rank_of[e["pid"]]
        if e["ph"] != "M" and (e["pid"], e["tid"]) not in threads:
            fail(f"track {e['tid']} of rank {e['rank']} has no thread_name")
    return rank_of


def check_nesting(events):
    tracks = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            tracks[(e["rank"], e["tid"])].append(e)
    for (pid, tid), spans in tracks.items():
        spans.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in spans:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - EPS_US:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + EPS_US:
                top = stack[-1]
                fail(f"rank {pid} track {tid}: '{e['name']}' [{e['ts']}, +{e['dur']}] overlaps "
                     f"'{top['name']}' [{top['ts']}, +{top['dur']}] without nesting in it")
            stack.append(e)
    return sum(len(s) for s in tracks.values())


def check_steps(events, ranks, expected, slack):
    counts = collections.Counter(e["rank"] for e in events
                                 if e["ph"] == "X" and e["name"] == "step")
    per_rank = [counts.get(r, 0) for r in range(ranks)]
    if max(per_rank) - min(per_rank) > slack:
        fail(f"step counts differ between ranks: {per_rank}")
    if per_rank[0] == 0:
        fail("no 'step' spans")
    if expected is not None and per_rank[0] != expected:
        fail(f"{per_rank[0]} steps per rank, expected {expected}")
    return per_rank[0]


def check_buckets(events, ranks):
    ready_re = re.compile(r"^bucket (\d+) ready$")
    run_re = re.compile(r"^(enqueue )?all_reduce \(ddp bucket (\d+)\)$")
    checked = 0
    runs_per_rank = []
    for r in range(ranks):
        ready = collections.defaultdict(list)
        enqueued = collections.defaultdict(list)
        started = collections.defaultdict(list)
        for e in events:
            if e["rank"] != r:
                continue
            m = ready_re.match(e["name"])
            if m and e["ph"] == "i":
                ready[int(m.group(1))].append(e["ts"])
            m = run_re.match(e["name"])
            if m and e["ph"] == "X" and e.get("cat") == "collective":
                (enqueued if m.group(1) else started)[int(m.group(2))].append(e["ts"])
        if not ready:
            fail(f"rank {r}: no 'bucket N ready' instants")
        for b, ready_ts in ready.items():
            for name, times in (("enqueued", enqueued[b]), ("started", started[b])):
                if len(times) != len(ready_ts):
                    fail(f"rank {r} bucket {b}: {len(ready_ts)} ready, {len(times)} all-reduces "
                         f"{name}")
                for k, (t_ready, t) in enumerate(zip(sorted(ready_ts), sorted(times))):
                    if t < t_ready - EPS_US:
                        fail(f"rank {r} bucket {b}: all-reduce {k} {name} at {t} us, before the "
                             f"bucket was ready at {t_ready} us")
                    checked += 1
        runs_per_rank.append(sum(len(v) for v in started.values()))
    if len(set(runs_per_rank)) != 1:
        fail(f"bucket all-reduces differ between ranks: {runs_per_rank}")
    return checked


def clock_error_us(trace):
    worst = 0.0
    for text in trace.get("otherData", {}).get("clocks", {}).values():
        m = re.search(r"\+-(\d+) ns", text)
        if m:
            worst = max(worst, int(m.group(1)) / 1000.0)
    return worst


def check_alignment(events, ranks, tolerance_us):
    spans = collections.defaultdict(dict)  # (comm, seq) -> rank -> (start, end)
    for e in events:
        args = e.get("args", {})
        if e["ph"] != "X" or e.get("cat") != "collective" or e["name"].startswith("enqueue "):
            continue
        if not e["name"].startswith("all_reduce") or "seq" not in args:
            continue
        spans[(args["comm"], args["seq"])][e["rank"]] = (e["ts"], e["ts"] + e["dur"])
    checked = 0
    for (comm, seq), by_rank in spans.items():
        if len(by_rank) != ranks:
            continue
        last_start = max(s for s, _ in by_rank.values())
        first_end = min(t for _, t in by_rank.values())
        if first_end < last_start - tolerance_us:
            fail(f"all_reduce #{seq} of comm {comm} ended on one rank at {first_end} us, before "
                 f"it started on another at {last_start} us: the ranks' clocks are not aligned "
                 f"(tolerance {tolerance_us:.0f} us); spans {by_rank}")
        checked += 1
    if checked == 0:
        fail("no all_reduce ran on every rank: nothing to check the clock alignment with")
    return checked


def check_flows(events):
    """Flow arrows as Perfetto reads them: bound to the X event that carries
    bind_id (flow_out: the arrow leaves it; flow_in: it enters it)."""
    leaves, enters = {}, {}
    for e in events:
        if e["ph"] in ("s", "t", "f"):
            fail(f"a flow event of its own (ph {e['ph']}): viewers bind it to whichever slice "
                 f"is open then; flows belong on their slices (bind_id): {e}")
        if "bind_id" not in e:
            continue
        if e["ph"] != "X":
            fail(f"bind_id on a '{e['ph']}' event: {e}")
        if not (e.get("flow_out") or e.get("flow_in")):
            fail(f"bind_id without flow_out or flow_in: {e}")
        for key, table in (("flow_out", leaves), ("flow_in", enters)):
            if e.get(key):
                if e["bind_id"] in table:
                    fail(f"flow {e['bind_id']} has two {key} slices: {table[e['bind_id']]} and {e}")
                table[e["bind_id"]] = e
    if not leaves:
        fail("no flow arrows")
    collectives = 0
    for flow, out in leaves.items():
        into = enters.get(flow)
        if into is None:
            continue  # a collective still in flight when the trace was written
        if into["ts"] < out["ts"] - EPS_US:
            fail(f"flow {flow} enters '{into['name']}' at {into['ts']} before it leaves "
                 f"'{out['name']}' at {out['ts']}")
        if out["name"].startswith("enqueue "):
            collectives += 1
            if out["dur"] <= 0:
                fail(f"the enqueue slice of flow {flow} has no duration: {out}")
            if into["name"] != out["name"][len("enqueue "):]:
                fail(f"flow {flow} leaves '{out['name']}' but enters '{into['name']}'")
            if into["rank"] != out["rank"] or into["args"].get("seq") != out["args"].get("seq"):
                fail(f"flow {flow} joins rank {out['rank']} #{out['args'].get('seq')} to rank "
                     f"{into['rank']} #{into['args'].get('seq')}")
    for flow in enters:
        if flow not in leaves:
            fail(f"flow {flow} enters '{enters[flow]['name']}' but leaves no slice")
    if collectives == 0:
        fail("no flow from an enqueue to its collective")
    return len(leaves)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--ranks", type=int, required=True)
    p.add_argument("--steps", type=int)
    p.add_argument("--buckets", action="store_true")
    p.add_argument("--step-slack", type=int, default=0)
    a = p.parse_args()
    trace = load(a.trace)
    events = trace["traceEvents"]
    check_metadata(events, a.ranks)
    spans = check_nesting(events)
    steps = check_steps(events, a.ranks, a.steps, a.step_slack)
    buckets = check_buckets(events, a.ranks) if a.buckets else 0
    aligned = check_alignment(events, a.ranks, 1000.0 + 2 * clock_error_us(trace))
    flows = check_flows(events)
    print(f"check_trace.py: ok: {a.ranks} ranks, {steps} steps each, {spans} spans nested, "
          f"{buckets} bucket all-reduces after ready, {aligned} all-reduces aligned, "
          f"{flows} flows")


if __name__ == "__main__":
    main()
