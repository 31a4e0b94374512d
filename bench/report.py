#!/usr/bin/env python3
"""Merge our bench results with the peers' (bench/peers.py) into one comparison.

Usage:
  python3 bench/report.py --ours ours.json --peers peers.json [more_peers.json ...] \
                          --out-dir DIR

Inputs use schema "rgk-bench-v1": {"device", "torch"?, "results": [{"name", "peer",
"samples_ms", "median_ms", "bytes", "flops", "error"}]}. In the --ours file an entry
whose peer is absent, null or "ours" is ours; entries named copy/... or gemm/...
are ceilings (cuBLAS / memcpy measured from Rust) whatever their peer. Several peers
files may be given (e.g. from runs split with --only); for a repeated (name, peer)
the lowest median wins.

Per row (one per bench of ours):
  ratio          = best peer median / our median   (> 1: we are faster)
  throughput     = bytes / time in GB/s (1e9), or flops / time in TFLOP/s (1e12);
                   flops win when a bench has both (attention, gemm)
  frac. ceiling  = GB/s / copy bandwidth, or TFLOP/s / fp16 GEMM TFLOP/s. Each ceiling
                   is the highest of ours and the peers' measurements in the run.
  per-peer cells = median ms, "error", "missing" (the peer ran this op family but
                   has no entry for this bench), or "-" (peer does not apply).
  peak memory    = meta "peak_memory_above_inputs_bytes" of ours and of each peer, where
                   given (a separate table: MiB and peer / ours).

Writes DIR/report.md, DIR/report.json, DIR/ratio.svg (log-scale bars of ratio with
a line at 1.0) and DIR/roofline.svg: fraction-of-ceiling bars for every bench (ours
vs best peer; most of our benches count only bytes, so a true roofline would be
nearly empty) plus, above them, a log-log roofline panel for the benches that
count both flops and bytes. Prints the Markdown table at the end.
"""

import argparse
import json
import math
import os
import statistics
import sys
from html import escape

SCHEMA = "rgk-bench-v1"
REPORT_SCHEMA = "rgk-report-v1"
OURS = "ours"
CEILING_PREFIXES = ("copy/", "gemm/")
GEMM_CEILING_PREFIX = "gemm/f16/"
# Column order for peers; unknown peer names follow, sorted.
PEER_ORDER = ["torch-eager", "torch-compile", "cublas-torch", "sdpa-flash", "sdpa-flash-det",
              "sdpa-cudnn", "sdpa-efficient", "sdpa-math"]
MISSING, ERROR, NOT_APPLICABLE = "missing", "error", "-"
OURS_COLOR, PEER_COLOR, FASTER_COLOR, SLOWER_COLOR = "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"
FONT = "font-family='DejaVu Sans Mono, monospace' font-size='11'"
CHAR_W = 7.4    # px per character at FONT (generous), to size the label margin
BAR_H, ROW_H = 14, 20


# ------------------------------------------------------------------------ loading

def load(path):
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != SCHEMA:
        print(f"warning: {path}: schema {doc.get('schema')!r}, expected {SCHEMA!r}",
              file=sys.stderr)
    return doc


def median_of(entry):
    """The entry's median in ms, or None when it failed or has no samples."""
    if entry.get("error"):
        return None
    med = entry.get("median_ms")
    if med is None and entry.get("samples_ms"):
        med = statistics.median(entry["samples_ms"])
    return med if med and med > 0 else None


def is_ours(entry):
    return entry.get("peer") in (None, OURS)


def is_ceiling(name):
    return name.startswith(CEILING_PREFIXES)


def keep_best(table, key, entry):
    """Store entry under key unless one already there is better (ok beats error,
    then lower median)."""
    old = table.get(key)
    if old is not None:
        print(f"warning: duplicate {entry.get('name')} {key}; keeping the faster",
              file=sys.stderr)
        new_m, old_m = median_of(entry), median_of(old)
        if new_m is None or (old_m is not None and old_m <= new_m):
            return
    table[key] = entry


def split_entries(ours_doc, peer_docs):
    """Return (ours by name, peers by name -> peer -> entry). Entries of the ours file
    with another peer name are counted as peers."""
    ours, peers = {}, {}
    for entry in ours_doc.get("results", []):
        if is_ours(entry):
            keep_best(ours, entry["name"], entry)
        else:
            keep_best(peers.setdefault(entry["name"], {}), entry["peer"], entry)
    for doc in peer_docs:
        for entry in doc.get("results", []):
            peer = entry.get("peer") or "unnamed-peer"
            keep_best(peers.setdefault(entry["name"], {}), peer, entry)
    return ours, peers


# ----------------------------------------------------------------------- metrics

def family(name):
    return name.split("/", 1)[0]


def gbps(nbytes, ms):
    return nbytes / ms / 1e6 if nbytes and ms else None


def tflops(flops, ms):
    return flops / ms / 1e9 if flops and ms else None


def counts(name, our_entry, peer_entries):
    """bytes and flops of a bench: ours first, else any peer's (same definition);
    a ceiling's name gives them when no entry does."""
    nbytes = flops = None
    for entry in [our_entry] + list(peer_entries.values()):
        if entry:
            nbytes = nbytes or entry.get("bytes")
            flops = flops or entry.get("flops")
    implied_bytes, implied_flops = implied_counts(name)
    return nbytes or implied_bytes, flops or implied_flops


def implied_counts(name):
    """(bytes, flops) that a ceiling's name implies, for entries written without them:
    copy/<dtype>/<N bytes> moves 2N bytes; gemm/<dtype>/MxNxK does 2*M*N*K flops."""
    parts = name.split("/")
    try:
        if parts[0] == "copy" and len(parts) == 3:
            return 2 * int(parts[2]), None
        if parts[0] == "gemm" and len(parts) == 3:
            m, n, k = (int(x) for x in parts[2].split("x"))
            return None, 2 * m * n * k
    except ValueError:
        pass
    return None, None


def best_ceiling(entries, rate):
    """(value, source) of the highest rate among ok entries, or (None, None)."""
    best = (None, None)
    for label, entry in entries:
        nbytes, flops = implied_counts(entry.get("name", ""))
        value = rate(entry.get("bytes") or nbytes, entry.get("flops") or flops,
                     median_of(entry))
        if value and (best[0] is None or value > best[0]):
            best = (value, label)
    return best


def ceilings(ours, peers):
    """Copy GB/s and fp16 GEMM TFLOP/s: the highest measured in the run, ours or a peer's. A ceiling
    is what the card reached, so a slower measurement (e.g. our cuBLAS call with its default
    algorithm) must not make every fraction of it look better."""
    def pick(prefix, rate):
        mine = [(f"ours {n}", e) for n, e in ours.items() if n.startswith(prefix)]
        theirs = [(f"{p} {n}", e) for n, by_peer in peers.items() if n.startswith(prefix)
                  for p, e in by_peer.items()]
        return best_ceiling(mine + theirs, rate)

    copy_v, copy_s = pick("copy/", lambda b, f, ms: gbps(b, ms))
    gemm_v, gemm_s = pick(GEMM_CEILING_PREFIX, lambda b, f, ms: tflops(f, ms))
    return {"copy_gbps": copy_v, "copy_source": copy_s,
            "gemm_f16_tflops": gemm_v, "gemm_source": gemm_s}


def throughput(nbytes, flops, ms, ceil):
    """(value, unit, fraction of ceiling); flops take precedence over bytes."""
    if ms is None:
        return None, None, None
    if flops:
        value = tflops(flops, ms)
        top = ceil["gemm_f16_tflops"]
        return value, "TFLOP/s", value / top if top else None
    if nbytes:
        value = gbps(nbytes, ms)
        top = ceil["copy_gbps"]
        return value, "GB/s", value / top if top else None
    return None, None, None


def peer_cells(name, by_peer, peer_names, families):
    """Per-peer {median_ms, status, error} for one bench."""
    cells = {}
    for peer in peer_names:
        entry = by_peer.get(peer)
        if entry is None:
            applies = family(name) in families.get(peer, set())
            cells[peer] = {"median_ms": None, "status": MISSING if applies else NOT_APPLICABLE,
                           "error": None}
        elif median_of(entry) is None:
            cells[peer] = {"median_ms": None, "status": ERROR,
                           "error": entry.get("error") or "no samples"}
        else:
            cells[peer] = {"median_ms": median_of(entry), "status": "ok", "error": None}
    return cells


def peak_memory_of(entry):
    """Bytes a call allocated at its high point above what was held before it (entry meta
    "peak_memory_above_inputs_bytes"; peers.py and our bench both write it), or None."""
    if not entry or entry.get("error"):
        return None
    value = (entry.get("meta") or {}).get("peak_memory_above_inputs_bytes")
    return value if isinstance(value, (int, float)) and value >= 0 else None


def build_row(name, our_entry, by_peer, peer_names, families, ceil):
    ours_ms = median_of(our_entry) if our_entry else None
    nbytes, flops = counts(name, our_entry, by_peer)
    cells = peer_cells(name, by_peer, peer_names, families)
    ok = {p: c["median_ms"] for p, c in cells.items() if c["status"] == "ok"}
    best_peer = min(ok, key=ok.get) if ok else None
    best_ms = ok.get(best_peer)
    ours_tp, unit, ours_frac = throughput(nbytes, flops, ours_ms, ceil)
    _, _, peer_frac = throughput(nbytes, flops, best_ms, ceil)
    if our_entry is None:
        status = "ours missing"
    elif ours_ms is None:
        status = "ours error"
    elif best_peer is None:
        status = "peer missing" if not by_peer else "peer error"
    else:
        status = "ok"
    return {"name": name, "status": status, "ours_ms": ours_ms,
            "ours_error": our_entry.get("error") if our_entry else None,
            "best_peer": best_peer, "best_peer_ms": best_ms,
            "ratio": best_ms / ours_ms if best_ms and ours_ms else None,
            "bytes": nbytes, "flops": flops,
            "intensity": flops / nbytes if flops and nbytes else None,
            "throughput": ours_tp, "throughput_unit": unit,
            "fraction_of_ceiling": ours_frac, "best_peer_fraction_of_ceiling": peer_frac,
            "peak_memory_bytes": {OURS: peak_memory_of(our_entry),
                                  **{p: peak_memory_of(by_peer.get(p)) for p in peer_names}},
            "peers": cells}


def peer_name_order(peers):
    names = {p for by_peer in peers.values() for p in by_peer}
    known = [p for p in PEER_ORDER if p in names]
    return known + sorted(names - set(known))


def peer_families(peers):
    """peer -> op families it has any entry for (decides 'missing' vs '-')."""
    fams = {}
    for name, by_peer in peers.items():
        for peer in by_peer:
            fams.setdefault(peer, set()).add(family(name))
    return fams


def build_report(ours_doc, peer_docs):
    ours, peers = split_entries(ours_doc, peer_docs)
    ceil = ceilings(ours, peers)
    peer_names = peer_name_order(peers)
    fams = peer_families(peers)

    def rows_for(names, source):
        return [build_row(n, source.get(n), peers.get(n, {}), peer_names, fams, ceil)
                for n in names]

    bench_names = [n for n in ours if not is_ceiling(n)]
    ceiling_names = [n for n in ours if is_ceiling(n)]
    ceiling_names += sorted(n for n in peers if is_ceiling(n) and n not in ours)
    peer_only = sorted(n for n in peers if n not in ours and not is_ceiling(n))
    errors = [{"name": n, "peer": p, "error": e.get("error")}
              for n, by_peer in sorted(peers.items()) for p, e in by_peer.items()
              if e.get("error")]
    errors += [{"name": n, "peer": OURS, "error": e.get("error")}
               for n, e in ours.items() if e.get("error")]
    return {"schema": REPORT_SCHEMA,
            "devices": {"ours": ours_doc.get("device"),
                        "peers": sorted({d.get("device") or "?" for d in peer_docs})},
            "torch": sorted({d.get("torch") or "?" for d in peer_docs}),
            "timing": sorted({d.get("timing") for d in peer_docs if d.get("timing")}),
            "ceilings": ceil, "peer_names": peer_names,
            "rows": rows_for(bench_names, ours),
            "ceiling_rows": rows_for(ceiling_names, ours),
            "peer_only_rows": rows_for(peer_only, ours),
            "errors": errors}


# ---------------------------------------------------------------------- markdown

def fmt_ms(ms):
    if ms is None:
        return None
    return f"{ms:.4f}" if ms < 10 else f"{ms:.2f}"


def fmt_num(x, digits=1):
    return "" if x is None else f"{x:,.{digits}f}"


def fmt_pct(x):
    return "" if x is None else f"{100 * x:.0f}%"


def fmt_ratio(r):
    return "" if r is None else f"{r:.2f}x"


def cell_text(cell):
    return fmt_ms(cell["median_ms"]) if cell["status"] == "ok" else cell["status"]


def md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def row_cells(row, peer_names):
    ours = fmt_ms(row["ours_ms"]) or ("missing" if row["status"] == "ours missing" else "error")
    tp = "" if row["throughput"] is None else f"{fmt_num(row['throughput'])} {row['throughput_unit']}"
    return ([f"`{row['name']}`", ours, row["best_peer"] or MISSING,
             fmt_ms(row["best_peer_ms"]) or "", fmt_ratio(row["ratio"]) or row["status"], tp,
             fmt_pct(row["fraction_of_ceiling"]), fmt_pct(row["best_peer_fraction_of_ceiling"])]
            + [cell_text(row["peers"][p]) for p in peer_names])


def main_table(rows, peer_names):
    header = (["bench", "ours ms", "best peer", "peer ms", "ratio", "ours throughput",
               "ours % ceil", "peer % ceil"] + [f"{p} ms" for p in peer_names])
    return md_table(header, [row_cells(r, peer_names) for r in rows])


def fmt_mib(nbytes):
    return "" if nbytes is None else f"{nbytes / (1 << 20):,.1f}"


def memory_table(rows, peer_names):
    """Peak device memory of one call, in MiB above what was held before it, ours and each peer's,
    and each peer's over ours; only rows where anyone reported it."""
    with_mem = [r for r in rows if any(v is not None for v in r["peak_memory_bytes"].values())]
    if not with_mem:
        return None
    peers = [p for p in peer_names if any(r["peak_memory_bytes"].get(p) is not None
                                          for r in with_mem)]
    header = (["bench", "ours MiB"] + [f"{p} MiB" for p in peers]
              + [f"{p} / ours" for p in peers])
    body = []
    for r in with_mem:
        mem = r["peak_memory_bytes"]
        ours = mem.get(OURS)
        ratios = [fmt_ratio(mem[p] / ours) if ours and mem.get(p) is not None else ""
                  for p in peers]
        body.append([f"`{r['name']}`", fmt_mib(ours)] + [fmt_mib(mem.get(p)) for p in peers]
                    + ratios)
    return md_table(header, body)


def ceiling_lines(report):
    ceil = report["ceilings"]
    copy = (f"{ceil['copy_gbps']:,.1f} GB/s ({ceil['copy_source']})"
            if ceil["copy_gbps"] else "missing")
    gemm = (f"{ceil['gemm_f16_tflops']:,.1f} TFLOP/s ({ceil['gemm_source']})"
            if ceil["gemm_f16_tflops"] else "missing")
    return [f"- copy bandwidth ceiling: {copy}", f"- fp16 GEMM ceiling: {gemm}"]


def markdown(report):
    dev = report["devices"]
    peer_names = report["peer_names"]
    out = ["# Benchmark report: ours vs peers", "",
           f"- device (ours): {dev['ours'] or '?'}",
           f"- device (peers): {', '.join(dev['peers']) or '?'}",
           f"- torch: {', '.join(report['torch']) or '?'}"]
    out += [f"- peer timing: {t}" for t in report["timing"]]
    out += ceiling_lines(report)
    out += ["- ratio = best peer median / our median (> 1: we are faster); "
            "% ceil = throughput / copy bandwidth (byte benches) or / fp16 GEMM "
            "TFLOP/s (flop benches)",
            "- peer cells: median ms, `error` (see below), `missing` (peer ran this op "
            "family but not this bench), `-` (does not apply)", "",
            "## Our benches", "", main_table(report["rows"], peer_names), ""]
    mem = memory_table(report["rows"], peer_names)
    if mem:
        out += ["## Peak device memory of one call", "",
                "MiB allocated at the call's high point above what was held before it (inputs and "
                "anything else live): PyTorch `max_memory_allocated()` after "
                "`reset_peak_memory_stats()` minus `memory_allocated()` before the call; ours the "
                "same from our allocation counter (`Gpu::memory_stats`: outputs, saved state and "
                "workspaces). `/ ours` > 1: the peer needs more.", "", mem, ""]
    if report["ceiling_rows"]:
        out += ["## Ceilings (ours = cuBLAS/memcpy from Rust)", "",
                main_table(report["ceiling_rows"], peer_names), ""]
    if report["peer_only_rows"]:
        out += ["## Peer benches with no result of ours", "",
                main_table(report["peer_only_rows"], peer_names), ""]
    if report["errors"]:
        out += ["## Errors", ""]
        out += [f"- `{e['name']}` {e['peer']}: {first_line(e['error'])}"
                for e in report["errors"]]
        out.append("")
    return "\n".join(out)


def first_line(text, limit=300):
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[:limit] + "..."


# --------------------------------------------------------------------------- svg

class Svg:
    """Minimal SVG text builder; coordinates in px."""

    def __init__(self, width, height):
        self.width, self.height, self.parts = width, height, []

    def rect(self, x, y, w, h, fill, title=None):
        tip = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f"<rect x='{x:.1f}' y='{y:.1f}' width='{max(w, 0):.1f}' "
                          f"height='{h:.1f}' fill='{fill}'>{tip}</rect>")

    def line(self, x1, y1, x2, y2, stroke="#000", width=1, dash=None):
        d = f" stroke-dasharray='{dash}'" if dash else ""
        self.parts.append(f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' "
                          f"stroke='{stroke}' stroke-width='{width}'{d}/>")

    def circle(self, x, y, r, fill, title=None):
        tip = f"<title>{escape(title)}</title>" if title else ""
        self.parts.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='{r}' fill='{fill}'>{tip}</circle>")

    def polyline(self, points, stroke, width=1.5):
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.parts.append(f"<polyline points='{pts}' fill='none' stroke='{stroke}' "
                          f"stroke-width='{width}'/>")

    def text(self, x, y, s, anchor="start", fill="#000", bold=False, size=None):
        weight = " font-weight='bold'" if bold else ""
        fs = f" font-size='{size}'" if size else ""
        self.parts.append(f"<text x='{x:.1f}' y='{y:.1f}' text-anchor='{anchor}' "
                          f"fill='{fill}'{weight}{fs}>{escape(str(s))}</text>")

    def render(self):
        return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{self.width:.0f}' "
                f"height='{self.height:.0f}' viewBox='0 0 {self.width:.0f} {self.height:.0f}' "
                f"{FONT}>\n<rect width='100%' height='100%' fill='white'/>\n"
                + "\n".join(self.parts) + "\n</svg>\n")


def label_width(rows):
    return max([len(r["name"]) for r in rows] + [10]) * CHAR_W + 16


def ratio_svg(rows, title):
    """Horizontal bars of log2(ratio) starting at 1.0; green = we are faster."""
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    lo = math.floor(min([math.log2(x) for x in ratios] + [-1]))
    hi = math.ceil(max([math.log2(x) for x in ratios] + [1]))
    left, plot_w, top = label_width(rows), 520, 50
    svg = Svg(left + plot_w + 90, top + ROW_H * max(len(rows), 1) + 50)

    def x_of(r):
        return left + (math.log2(r) - lo) / (hi - lo) * plot_w

    svg.text(svg.width / 2, 20, title, anchor="middle", bold=True, size=13)
    bottom = top + ROW_H * len(rows)
    for e in range(lo, hi + 1):  # power-of-two grid
        svg.line(x_of(2.0 ** e), top - 5, x_of(2.0 ** e), bottom, stroke="#ddd")
        svg.text(x_of(2.0 ** e), bottom + 15, f"{2.0 ** e:g}x", anchor="middle")
    svg.text(left + plot_w / 2, bottom + 35,
             "best peer time / our time (log scale; right of 1 = we are faster)",
             anchor="middle")
    for i, row in enumerate(rows):
        y = top + i * ROW_H
        svg.text(left - 8, y + ROW_H / 2 + 4, row["name"], anchor="end")
        r = row["ratio"]
        if r is None:
            svg.text(x_of(1.0) + 6, y + ROW_H / 2 + 4, row["status"], fill="#888")
            continue
        x0, x1 = sorted((x_of(1.0), x_of(r)))
        color = FASTER_COLOR if r >= 1 else SLOWER_COLOR
        svg.rect(x0, y + (ROW_H - BAR_H) / 2, x1 - x0, BAR_H, color,
                 title=f"{row['name']}: {r:.3f}x vs {row['best_peer']}")
        svg.text(x_of(r) + (4 if r >= 1 else -4), y + ROW_H / 2 + 4,
                 f"{r:.2f}x {row['best_peer']}", anchor="start" if r >= 1 else "end")
    svg.line(x_of(1.0), top - 8, x_of(1.0), bottom, stroke="#000", width=1.5)
    return svg.render()


def roofline_points(rows, ceil):
    return [r for r in rows if r["intensity"] and ceil["copy_gbps"] and ceil["gemm_f16_tflops"]]


def draw_roofline(svg, rows, ceil, left, top, w, h):
    """Log-log roofline: x = flop/byte, y = TFLOP/s; roof = min(BW*I, GEMM peak)."""
    bw_tb = ceil["copy_gbps"] / 1000.0        # GB/s * flop/byte / 1000 = TFLOP/s
    peak = ceil["gemm_f16_tflops"]
    ridge = peak / bw_tb
    values = [r["throughput"] for r in rows if r["throughput"]]
    values += [tflops(r["flops"], r["best_peer_ms"]) for r in rows if r["best_peer_ms"]]
    xs = [r["intensity"] for r in rows] + [ridge]
    x_lo, x_hi = math.floor(math.log10(min(xs) / 2)), math.ceil(math.log10(max(xs) * 2))
    y_lo = math.floor(math.log10(min(values + [peak]) * 0.8))
    y_hi = math.ceil(math.log10(peak * 1.1))

    def px(i):
        return left + (math.log10(i) - x_lo) / (x_hi - x_lo) * w

    def py(t):
        return top + h - (math.log10(t) - y_lo) / (y_hi - y_lo) * h

    for e in range(x_lo, x_hi + 1):
        svg.line(px(10 ** e), top, px(10 ** e), top + h, stroke="#ddd")
        svg.text(px(10 ** e), top + h + 15, f"{10.0 ** e:g}", anchor="middle")
    for e in range(y_lo, y_hi + 1):
        svg.line(left, py(10 ** e), left + w, py(10 ** e), stroke="#ddd")
        svg.text(left - 6, py(10 ** e) + 4, f"{10.0 ** e:g}", anchor="end")
    svg.text(left + w / 2, top + h + 32, "arithmetic intensity (flop/byte)", anchor="middle")
    svg.text(left - 50, top - 8, "TFLOP/s")
    i0, i1 = 10.0 ** x_lo, 10.0 ** x_hi
    svg.polyline([(px(i0), py(max(bw_tb * i0, 10.0 ** y_lo))), (px(ridge), py(peak)),
                  (px(i1), py(peak))], stroke="#444")
    for i, row in enumerate(rows):
        x = px(row["intensity"])
        if row["throughput"]:
            svg.circle(x, py(row["throughput"]), 4, OURS_COLOR,
                       title=f"{row['name']} ours {row['throughput']:.1f} TFLOP/s")
            svg.text(x + 6, py(row["throughput"]) + 4, f"{i + 1}", fill=OURS_COLOR)
        if row["best_peer_ms"]:
            t = tflops(row["flops"], row["best_peer_ms"])
            svg.circle(x, py(t), 3, PEER_COLOR, title=f"{row['name']} {row['best_peer']} {t:.1f}")
    for i, row in enumerate(rows):  # numbered legend to the right of the panel
        svg.text(left + w + 15, top + 12 + i * 14, f"{i + 1}: {row['name']}", size=10)


def draw_fraction_bars(svg, rows, left, top, w):
    """Per bench: ours (blue) and best peer (orange) fraction of ceiling, 0..max."""
    fracs = [f for r in rows for f in (r["fraction_of_ceiling"],
                                       r["best_peer_fraction_of_ceiling"]) if f]
    hi = max(fracs + [1.0]) * 1.05

    def px(f):
        return left + f / hi * w

    bottom = top + ROW_H * len(rows)
    for k in range(0, int(hi * 4) + 1):
        svg.line(px(k / 4), top - 5, px(k / 4), bottom, stroke="#ddd")
        svg.text(px(k / 4), bottom + 15, f"{k * 25}%", anchor="middle")
    svg.text(left + w / 2, bottom + 35, "fraction of ceiling (copy GB/s for byte benches, "
             "fp16 GEMM TFLOP/s for flop benches)", anchor="middle")
    half = BAR_H / 2
    for i, row in enumerate(rows):
        y = top + i * ROW_H + (ROW_H - BAR_H) / 2
        svg.text(left - 8, y + BAR_H - 3, row["name"], anchor="end")
        for j, (key, color, who) in enumerate(
                [("fraction_of_ceiling", OURS_COLOR, "ours"),
                 ("best_peer_fraction_of_ceiling", PEER_COLOR, row["best_peer"] or "peer")]):
            f = row[key]
            if f is not None:
                svg.rect(left, y + j * half, px(f) - left, half - 1, color,
                         title=f"{row['name']} {who}: {100 * f:.1f}%")
        if row["fraction_of_ceiling"] is not None:
            svg.text(px(row["fraction_of_ceiling"]) + 4, y + half - 2,
                     fmt_pct(row["fraction_of_ceiling"]), size=9)
    svg.line(px(1.0), top - 8, px(1.0), bottom, stroke="#000", dash="4,3")
    return bottom + 45


def roofline_svg(rows, ceil, title):
    points = roofline_points(rows, ceil)
    left, plot_w = label_width(rows), 520
    legend_w = max([len(r["name"]) for r in points] + [0]) * 6.2 + 40
    roof_h = 300 if points else 0
    bars_top = 60 + (roof_h + 70 if points else 0)
    height = bars_top + ROW_H * max(len(rows), 1) + 50
    svg = Svg(left + plot_w + max(legend_w, 60), height)
    svg.text(svg.width / 2, 20, title, anchor="middle", bold=True, size=13)
    svg.rect(left, 30, 10, 10, OURS_COLOR)
    svg.text(left + 14, 39, "ours")
    svg.rect(left + 60, 30, 10, 10, PEER_COLOR)
    svg.text(left + 74, 39, "best peer")
    if points:
        draw_roofline(svg, points, ceil, left, 70, plot_w, roof_h)
    draw_fraction_bars(svg, rows, left, bars_top, plot_w)
    return svg.render()


# --------------------------------------------------------------------------- main

def write_outputs(report, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    md = markdown(report)
    files = {"report.md": md,
             "report.json": json.dumps(report, indent=1) + "\n",
             "ratio.svg": ratio_svg(report["rows"], "Speed-up over the best peer"),
             "roofline.svg": roofline_svg(report["rows"], report["ceilings"],
                                          "Achieved fraction of ceiling")}
    for fname, text in files.items():
        with open(os.path.join(out_dir, fname), "w") as f:
            f.write(text)
    return md


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ours", required=True, help="our results (rgk-bench-v1 JSON)")
    p.add_argument("--peers", required=True, nargs="+", help="peers.py output file(s)")
    p.add_argument("--out-dir", required=True)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    report = build_report(load(args.ours), [load(p) for p in args.peers])
    md = write_outputs(report, args.out_dir)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
