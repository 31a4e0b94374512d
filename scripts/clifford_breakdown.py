#!/usr/bin/env python3
"""Per-part time of a Clifford layer's forward and backward, each part against its floor.

Runs the bundle's `clifford_breakdown` example (one configuration forward + backward, twice) under
Nsight Compute with the clocks left as they are (`--clock-control none`), keeps the kernels of the
second call, and groups them by the launch sequence of host/src/ops/clifford/mod.rs:

  forward:  linear (the Layer's per-grade map), pairs, weight stacking, mix (fc matmuls), norm, sgp
  (a matmul's B split pass counts with its product)
  backward: norm (grade dots), pairs (recomputed, a phase at a time), mix weight grads (pairs^T gu,
            split-K and its finish), weight (un)stacking, mix input grads (gu W^T), pairs backward
            (one a phase), sgp backward +
            weight-gradient sum,
            linear input grad, linear weight grad (+ finish), bias grad

Each part's floor is the larger of its DRAM bytes (as Nsight Compute counts them) over the copy
bandwidth and its matrix FLOPs over the tensor-core rate of the precision (H100 SXM dense TF32
494.7 TFLOP/s; 3xTF32 a third of it; IEEE fp32 FMA 66.9 TFLOP/s). Nsight Compute flushes the caches
before every kernel, so each kernel starts with a cold L2.

  python3 scripts/clifford_breakdown.py BUNDLE_DIR [--copy-gbs 3000] [CONFIG ...]
  CONFIG = KIND:DIMS:B:N[:PRECISION], default layer:2:4096:512 layerfc:2:4096:512 fcgp:2:4096:512
"""
import csv, io, subprocess, sys, shutil

TF32_RATE = 494.7e12
RATES = {"tf32x3": TF32_RATE / 3, "tf32": TF32_RATE, "ieee": 66.9e12}
SLOTS = {2: 14, 3: 44}
METRICS = "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum"


def ncu_kernels(ncu, exe, args):
    cmd = [ncu, "--clock-control", "none", "--metrics", METRICS, "--csv", exe] + args
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    text = out.stdout[out.stdout.find('"ID"'):]
    kernels = {}
    for row in csv.DictReader(io.StringIO(text)):
        k = kernels.setdefault(int(row["ID"]), {"name": row["Kernel Name"]})
        v = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "")
        if row["Metric Name"] == "gpu__time_duration.sum":
            k["ns"] = v * {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
        else:
            k["bytes"] = k.get("bytes", 0) + v * {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
    seq = [kernels[i] for i in sorted(kernels)]
    return seq[len(seq) // 2:]  # the second of two identical calls


def classify(seq, kind):
    parts, phase, pairs_seen, bias_seen = [], "fwd", False, False
    # A product's B split pass (sm_90 f32 kernels) counts with the product it feeds.
    names = [k["name"].split("(")[0] for k in seq]
    for i, n in enumerate(names):
        if n.startswith("matmul_wg_split_b"):
            names[i] = next((m for m in names[i + 1:] if not m.startswith("matmul_wg_split_b")), n)
    # The backward's products after its last pairs-backward (or sgp backward) kernel are the
    # Layer's linear map's; the fc backward runs its pair-term products in two phases, each ending
    # with a pairs backward, so the first of those does not end the mixing.
    last_gp_bwd = max((i for i, n in enumerate(names)
                       if n.startswith("fc_pairs_bwd") or n.startswith("sgp") and "bwd" in n),
                      default=-1)
    for i, (k, n) in enumerate(zip(seq, names)):
        fc_done = i > last_gp_bwd
        if n.startswith("grade_dot"):
            phase, pairs_seen = "bwd", False
        if n.startswith("fc_permute"):
            # The fc weights stacked by grade (forward, backward) and the gradient put back.
            parts.append((f"{phase} weight stacking", k))
            continue
        if phase == "fwd":
            # The pair terms, or (the pair-term product at up to 128 features) y scaled by the gates.
            if n.startswith("fc_pairs") or n.startswith("fc_gate_y"):
                part, pairs_seen = "fwd pairs", True
            elif n.startswith("matmul"):
                part = "fwd mix" if pairs_seen or n.startswith("matmul_wg_pairs") else "fwd linear"
            elif n.startswith("grade_norm"):
                part = "fwd norm"
            else:
                part = "fwd sgp"
        else:
            if n.startswith("grade_dot"):
                part = "bwd norm"
            elif n.startswith("fc_pairs_bwd") or n.startswith("sgp"):
                part = "bwd pairs backward" if n.startswith("fc") else "bwd sgp"
            elif n.startswith("fc_pairs"):
                part = "bwd pairs (recomputed)"
            elif n.startswith("chunk_sum"):
                part = "bwd bias grad" if bias_seen else "bwd sgp"
            elif n.startswith("col_sum"):
                part, bias_seen = "bwd bias grad", True
            elif n.startswith("matmul"):
                # The input gradients multiply by a transposed weight; the weight gradients read a
                # transposed A (`_t_`, or `_tn_` on the mma.sync kernels).
                grad_in = "_nt_" in n or "_n_f32" in n
                who = "linear" if fc_done else "mix"
                part = f"bwd {who} {'input grad' if grad_in else 'weight grad'}"
            else:
                part = "bwd other"
        parts.append((part, k))
    return parts


def flops_of(part, kind, dims, b, n):
    c = 1 << dims
    lin = 2 * c * b * n * n
    mix = 2 * SLOTS[dims] * b * n * n
    if "linear" in part:
        return lin
    if "mix" in part:
        return mix
    return 0


def main(argv):
    if len(argv) < 1:
        print(__doc__)
        return 2
    bundle, rest = argv[0], argv[1:]
    copy = 3000e9
    if rest[:1] == ["--copy-gbs"]:
        copy, rest = float(rest[1]) * 1e9, rest[2:]
    configs = rest or ["layer:2:4096:512", "layerfc:2:4096:512", "fcgp:2:4096:512"]
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    exe = f"{bundle}/clifford_breakdown"
    for cfg in configs:
        f = cfg.split(":")
        kind, dims, b, n = f[0], int(f[1]), int(f[2]), int(f[3])
        prec = f[4] if len(f) > 4 else "tf32x3"
        seq = ncu_kernels(ncu, exe, [kind, str(dims), str(b), str(n), prec])
        order, agg = [], {}
        for part, k in classify(seq, kind):
            if part not in agg:
                order.append(part)
                agg[part] = {"ns": 0.0, "bytes": 0.0, "kernels": 0}
            agg[part]["ns"] += k.get("ns", 0)
            agg[part]["bytes"] += k.get("bytes", 0)
            agg[part]["kernels"] += 1
        print(f"\n### {kind} {dims}D B{b} N{n} {prec} (kernel times under ncu, cold L2)\n")
        print("| part | kernels | time us | DRAM MB | FLOP G | floor us | time / floor |")
        print("|---|---|---|---|---|---|---|")
        tot = {"ns": 0.0, "floor": 0.0}
        for part in order:
            a = agg[part]
            fl = flops_of(part, kind, dims, b, n)
            floor = max(a["bytes"] / copy, fl / RATES[prec]) * 1e6
            tot["ns"] += a["ns"]
            tot["floor"] += floor
            print(f"| {part} | {a['kernels']} | {a['ns'] / 1e3:.1f} | {a['bytes'] / 1e6:.1f} | "
                  f"{fl / 1e9:.2f} | {floor:.1f} | {a['ns'] / 1e3 / max(floor, 1e-9):.2f} |")
        print(f"| total | {len(seq)} | {tot['ns'] / 1e3:.1f} | | | {tot['floor']:.1f} | "
              f"{tot['ns'] / 1e3 / max(tot['floor'], 1e-9):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
