#!/usr/bin/env bash
# gpu_truth.sh: tailgate against a real NVIDIA GPU, offline, from the checkout.
#
#   tests/device/gpu_truth.sh [OUT_DIR]        (run as root on the GPU machine)
#
# What it does:
#   1. makes a venv in OUT_DIR/venv from wheels brought along (WHEELS, default ./wheels:
#      `pip download -d wheels '.[nvidia]' torch setuptools wheel` on a connected machine); no network
#   2. keeps the raw captures in OUT_DIR/raw: nvidia-smi -q, nvlink -e / -s, the GPUs' PCI
#      tree (sysfs attributes of every device on each GPU's chain of ports), the kernel
#      log's GPU, AER and machine-check lines
#   3. runs `tailgate inspect --platform baremetal --json` (NVML through nvidia-ml-py)
#   4. checks: every l1.gpu.* id has a finding for every GPU of the PCI tree (an unknown
#      is listed with its reason for a human to confirm it is true there); NVML and
#      nvidia-smi agree field by field; an idle GPU's lowered PCIe link speed is no fail
#   5. with torch: drives the CUDA caching allocator through an inference-like mix (KV
#      blocks and activations of varied sizes), dumps torch.cuda.memory_stats() and the
#      allocator snapshot, and judges l4.memory.fragmentation on them; the snapshot's own
#      count of free bytes inside split segments is compared with the judged figure
#
# Exit status: 0 every check held; 1 a check failed (OUT_DIR/summary.json says which);
# 2 this is not a machine it can run on (no NVIDIA GPU, no wheels).
# Store OUT_DIR/raw as a fixture named with the driver version it prints.
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$here/gpu-truth-out}" && cd "${1:-$here/gpu-truth-out}" && pwd)
wheels=${WHEELS:-$here/wheels}
raw=$out/raw
mkdir -p "$raw"

gpus=()
for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
    case "$(cat "$d/class" 2>/dev/null)" in 0x03*|0x12*) gpus+=("$(basename "$d")") ;; esac
done
if [ ${#gpus[@]} -eq 0 ] || ! command -v nvidia-smi >/dev/null; then
    echo "gpu_truth: no NVIDIA GPU here (PCI tree: ${#gpus[@]} GPU(s); nvidia-smi:" \
         "$(command -v nvidia-smi || echo absent)): nothing to check" >&2
    exit 2
fi
if [ ! -d "$wheels" ]; then
    echo "gpu_truth: no wheels at $wheels (set WHEELS=DIR; make them on a connected" \
         "machine: pip download -d wheels '.[nvidia]' torch setuptools wheel)" >&2
    exit 2
fi

# 1. an offline venv
python3 -m venv "$out/venv"
py=$out/venv/bin/python
"$py" -m pip install -q --no-index --find-links "$wheels" -e "$here[nvidia]"
"$py" -m pip install -q --no-index --find-links "$wheels" torch 2>/dev/null \
    || echo "gpu_truth: no torch wheel: the allocator check is not run" >&2

# 2. raw captures
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1 | tr -d ' ')
model=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
echo "$driver" > "$raw/driver_version"
nvidia-smi -q > "$raw/nvidia-smi-q-$driver-$model.txt"
for sub in e s; do  # empty output is what a GPU without NVLink prints: keep it as it is
    nvidia-smi nvlink -$sub > "$raw/nvidia-smi-nvlink-$sub-$driver.txt" 2>&1 \
        || echo "exit $?" >> "$raw/nvidia-smi-nvlink-$sub-$driver.txt"
done
{ dmesg 2>/dev/null || journalctl -k -b -o short-monotonic --no-pager -q; } \
    | grep -E 'NVRM|nvidia|AER|pcieport|Hardware Error|EDAC|mce:' > "$raw/kernel-gpu-lines.txt" || true
for g in "${gpus[@]}"; do
    chain=$(readlink -f "/sys/bus/pci/devices/$g")
    echo "$chain" > "$raw/pci-chain-$g.txt"
    dir=$chain
    while [[ $(basename "$dir") =~ ^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$ ]]; do
        for f in class vendor device current_link_speed current_link_width max_link_speed \
                 max_link_width aer_dev_correctable aer_dev_fatal aer_dev_nonfatal numa_node; do
            [ -r "$dir/$f" ] && printf '%s/%s:\n%s\n' "$(basename "$dir")" "$f" "$(cat "$dir/$f")"
        done
        dir=$(dirname "$dir")
    done > "$raw/pci-tree-$g.txt"
done

# 3. tailgate inspect, NVML first
"$py" -m tailgate inspect --platform baremetal --interval 2 --no-history \
    --json "$out/inspect.json" --save "$out/snapshot.json" --quiet || true

# 5 (before the checks, so that its report is judged with them). The allocator workload.
if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    "$py" - "$out" <<'EOF'
import json, pickle, random, sys
import torch
out = sys.argv[1]
random.seed(42)
dev = torch.device("cuda:0")
kv_block = 2 * 2**20                     # a paged-attention KV block: 2 MiB
kv, acts = [], []
for step in range(4000):                 # decode steps: KV grows, activations come and go
    kv.append(torch.empty(kv_block, dtype=torch.uint8, device=dev))
    acts.append(torch.empty(random.choice([1, 3, 7, 24, 96]) * 2**20 + random.randrange(4096),
                            dtype=torch.uint8, device=dev))
    if len(acts) > 8:
        acts.pop(random.randrange(len(acts)))
    if step % 50 == 49:                  # a request finishes: its KV blocks are freed
        for _ in range(40):
            kv.pop(random.randrange(len(kv)))
torch.cuda.synchronize()
stats = torch.cuda.memory_stats(dev)
json.dump({"cuda:0": stats}, open(f"{out}/memory_stats.json", "w"))
snap = torch.cuda.memory._snapshot()
pickle.dump(snap, open(f"{out}/memory_snapshot.pickle", "wb"))
# free bytes inside segments that also hold a live block: the snapshot's own count
split_free = sum(b["size"] for s in snap["segments"] if len(s["blocks"]) > 1
                 for b in s["blocks"] if b["state"] == "inactive")
reserved = sum(s["total_size"] for s in snap["segments"])
json.dump({"split_free_bytes": split_free, "reserved_bytes": reserved},
          open(f"{out}/snapshot_summary.json", "w"))
EOF
    "$py" -m tailgate inspect --memory-stats "$out/memory_stats.json" --interval 0 --no-history \
        --json "$out/inspect-memory.json" --quiet || true
fi

# 4. the checks
"$py" - "$out" "${gpus[@]}" <<'EOF'
import json, subprocess, sys
from pathlib import Path
out, gpus = Path(sys.argv[1]), sys.argv[2:]
rep = json.loads((out / "inspect.json").read_text())
problems, notes = [], []
by = {}
for f in rep["findings"]:
    by.setdefault(f["id"], []).append(f)
for cid in ("l1.gpu.xid", "l1.gpu.ecc", "l1.gpu.memory_repair", "l1.gpu.nvlink",
            "l1.gpu.clock_events"):
    for g in gpus:
        mine = [f for f in by.get(cid, []) if (f["subject"] or "").startswith(g)]
        if not mine:
            problems.append(f"{cid}: no finding for {g}")
        for f in mine:
            if f["status"] == "error":
                problems.append(f"{cid} {g}: error {f['reason']}")
            elif f["status"] == "unknown":
                notes.append(f"{cid} {g}: unknown: {f['reason']} (confirm it is true here)")
            src = (f.get("evidence") or {}).get("source", "")
            if cid != "l1.gpu.xid" and src and not src.startswith("NVML"):
                problems.append(f"{cid} {g}: read from {src}, not NVML")
for f in by.get("l1.pcie.link_downtrained", []):
    ev = f.get("evidence") or {}
    if (f["subject"] or "").endswith(" gpu") and f["status"] == "fail" \
            and ev.get("current", "").split(" x")[-1] == ev.get("capable", "").split(" x")[-1]:
        problems.append(f"idle GPU link speed judged a failure: {f['subject']}: {f['reason']}")
# NVML and nvidia-smi, field by field
import pynvml
from tailgate.sources import gpu as G
pynvml.nvmlInit()
try:
    nvml = G.nvml_health(pynvml)
finally:
    pynvml.nvmlShutdown()
smi = G.parse_smi_health(next((out / "raw").glob("nvidia-smi-q-*.txt")).read_text())
for bdf in sorted(set(nvml) | set(smi)):
    a, b = nvml.get(bdf), smi.get(bdf)
    if a is None or b is None:
        problems.append(f"{bdf}: in {'nvidia-smi' if a is None else 'NVML'} only")
        continue
    def flat(d, pre=""):
        out = {}
        for k, v in (d or {}).items():
            out.update(flat(v, f"{pre}{k}/") if isinstance(v, dict) else {f"{pre}{k}": v})
        return out
    for key in ("ecc_mode", "ecc", "remapped_rows", "retired_pages", "clock_events"):
        fa, fb = flat({key: a.get(key)}), flat({key: b.get(key)})
        for k in sorted(set(fa) & set(fb)):  # field by field where both print the field
            if fa[k] != fb[k]:
                problems.append(f"{bdf} {k}: NVML {fa[k]!r} != nvidia-smi {fb[k]!r}")
        for k in sorted(set(fa) ^ set(fb)):
            notes.append(f"{bdf} {k}: only in {'NVML' if k in fa else 'nvidia-smi'}")
# the allocator
mem = out / "inspect-memory.json"
if mem.exists():
    m = json.loads(mem.read_text())
    [frag] = [f for f in m["findings"] if f["id"] == "l4.memory.fragmentation"]
    s = json.loads((out / "snapshot_summary.json").read_text())
    ev = frag["evidence"]
    notes.append(f"l4.memory.fragmentation: {frag['status']} {frag['observed']} % "
                 f"({frag['reason']}); snapshot split-free {s['split_free_bytes']} B of "
                 f"{s['reserved_bytes']} B")
    if ev.get("inactive_split_bytes") != s["split_free_bytes"]:
        problems.append(f"fragmentation: memory_stats inactive_split_bytes "
                        f"{ev.get('inactive_split_bytes')} != snapshot {s['split_free_bytes']}")
else:
    notes.append("no torch on this machine: l4.memory.fragmentation not judged on a GPU")
summary = {"driver": (out / "raw" / "driver_version").read_text().strip(), "gpus": gpus,
           "problems": problems, "notes": notes}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(json.dumps(summary, indent=2))
sys.exit(1 if problems else 0)
EOF
