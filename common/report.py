"""Markdown tables for the README from a results JSON, so README figures come from the files.

    python -m common.report benchmarks/results/norm.json [--min-elements 16777216] [--graph]

One table per op, one row per shape, one column group per dtype: our GB/s with its share of the
copy bandwidth (or TFLOP/s where the rows carry no bytes), then every baseline's figure. The best
figure of each group is in bold. --graph: the same from the GPU times of the rows that have one
(graph_ms: CUDA-graph replays, the host out of the loop), for the rows and providers that carry it.
"""
import argparse
import json
import math


def _elements(shape):
    """Element count of a "16384x4096" shape; a named shape (a model's parameter list) always shows."""
    parts = shape.split("x")
    return math.prod(int(d) for d in parts) if all(d.isdigit() for d in parts) else math.inf


def graph_row(r):
    """A row's figures recomputed from its GPU time (graph_ms) instead of do_bench's ms."""
    scale = r["ms"] / r["graph_ms"]
    return dict(r, GBps=r["GBps"] and r["GBps"] * scale, TFLOPs=r["TFLOPs"] and r["TFLOPs"] * scale,
                pct_copy=r.get("graph_pct_copy"))


def tables(path, min_elements=0, graph=False):
    """One markdown table per op in the file, preceded by a line naming the run; graph: from GPU
    times (graph_ms), only the rows that have one."""
    data = json.load(open(path))
    meta, rows = data["meta"], data["rows"]
    if graph:
        rows = [graph_row(r) for r in rows if r.get("graph_ms")]
    metric = "GBps" if rows and rows[0]["GBps"] is not None else "TFLOPs"
    cell = {(r["op"], r["shape"], r["dtype"], r["provider"]): r for r in rows}
    out = [f"{meta['gpu']}, {meta['date']}, torch {meta['torch']}, triton {meta['triton']}; copy bandwidth "
           f"{meta['copy_GBps']:.0f} GB/s. Figures in {metric}{' from GPU time (CUDA graphs)' if graph else ''}; "
           "ours also as a share of the copy bandwidth."]
    for op in dict.fromkeys(r["op"] for r in rows):
        sel = [r for r in rows if r["op"] == op]
        dtypes = list(dict.fromkeys(r["dtype"] for r in sel))
        providers = list(dict.fromkeys(r["provider"] for r in sel if r["provider"] != "triton"))
        shapes = [s for s in dict.fromkeys(r["shape"] for r in sel) if _elements(s) >= min_elements]
        head = ["shape"] + [f"{dt} {p}" for dt in dtypes for p in ["triton"] + providers]
        out += ["", f"**{op}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for shape in shapes:
            line = [shape]
            for dt in dtypes:
                found = [cell.get((op, shape, dt, p)) for p in ["triton"] + providers]
                values = [r[metric] if r and r[metric] is not None else None for r in found]
                best = max((v for v in values if v is not None), default=None)
                for i, (r, v) in enumerate(zip(found, values)):
                    num = "" if v is None else (f"{v:.0f}" if v >= 100 else f"{v:.3g}")  # decode-sized rows keep 3 digits
                    text = f"**{num}**" if v is not None and v == best else num
                    if i == 0 and r and r["pct_copy"] is not None:
                        text += f" ({r['pct_copy']:.0f}%)"
                    line.append(text)
            out.append("| " + " | ".join(line) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument("--min-elements", type=int, default=0)
    parser.add_argument("--graph", action="store_true", help="figures from the GPU times (graph_ms)")
    args = parser.parse_args()
    print(tables(args.json, args.min_elements, args.graph))
