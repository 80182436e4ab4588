"""Merge benchmark results JSON written by filtered runs (--mode, --only, --dtype) of one benchmark
into one file, for a benchmark whose whole run does not fit one device call.

    python scripts/merge_results.py OUT.json PART.json [PART.json ...] [--commit SHA] [--note TEXT]

Each part is {"meta", "rows"} as devtools/results.write_json writes it. The parts must come from the
same GPU, torch and Triton, and no (op, shape, dtype, mode, provider) row may appear twice. OUT's
meta is the first part's, with every part's command, the lowest copy bandwidth, and `notes` (the
report prints them) naming the parts. --commit: the commit that holds the measured tree, for runs of
a working tree committed after them (the parts then say dirty); --note: one more note.
"""

import argparse
import json
import pathlib
import sys

SAME = ("gpu", "torch", "triton")


def row_key(row):
    return row["op"], row["shape"], row["dtype"], row.get("mode", "fwd"), row["provider"]


def merge(parts, commit=None, note=None):
    """(meta, rows) of the merged parts; raises ValueError where they do not belong together."""
    metas = [p["meta"] for p in parts]
    for key in SAME:
        values = {m.get(key) for m in metas}
        if len(values) > 1:
            raise ValueError(f"parts differ in {key}: {sorted(map(str, values))}")
    rows, seen = [], set()
    for part in parts:
        for row in part["rows"]:
            key = row_key(row)
            if key in seen:
                raise ValueError(f"row {key} is in more than one part")
            seen.add(key)
            rows.append(row)
    meta = dict(metas[0])
    meta["command"] = "; ".join(m["command"] for m in metas)
    meta["copy_GBps"] = min(m["copy_GBps"] for m in metas)
    meta["date"] = max(m["date"] for m in metas)
    notes = list(meta.get("notes") or [])
    meta.pop("note", None)  # a part's own note speaks of that part: kept below, naming it
    notes += [f"`{m['command']}`: {m['note']}" for m in metas if m.get("note")]
    notes.append(
        f"Merged from {len(parts)} runs on one {meta['gpu']}: "
        + "; ".join(f"`{m['command']}` ({m['date']}, {str(m.get('commit'))[:12]})" for m in metas)
        + "."
    )
    if commit:
        dirty = [m for m in metas if m.get("dirty")]
        for m in dirty:  # the other parts' rows were measured at their own (clean) commits
            notes.append(
                f"`{m['command']}` measured a working tree of {m['commit'][:12]} with changes since "
                f"committed as {commit[:12]}."
            )
        meta["commit"], meta["dirty"] = commit, False
    if note:
        notes.append(note)
    meta["notes"] = notes
    return meta, rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("parts", type=pathlib.Path, nargs="+")
    parser.add_argument("--commit", default=None)
    parser.add_argument("--note", default=None)
    args = parser.parse_args()
    try:
        meta, rows = merge([json.loads(p.read_text()) for p in args.parts], args.commit, args.note)
    except ValueError as e:
        sys.exit(f"merge_results: {e}")
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}: {len(rows)} rows from {len(args.parts)} parts")


if __name__ == "__main__":
    main()
