"""Generates collectors/formats/xid_catalog_data.py (every Xid of NVIDIA's catalog with this agent's grade) from
the saved catalog, collectors/formats/data/nvidia_xid_catalog.tsv.

    python -m collectors.formats.xid_catalog_generate            # rewrite xid_catalog_data.py
    python -m collectors.formats.xid_catalog_generate --check    # exit 1 when it differs (a test runs this)
    python -m collectors.formats.xid_catalog_generate --import-gpud catalog_generated.go --commit <sha>
        # refresh the .tsv from a newer leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go
        # (its catalogEntries rows, each field as written there), then run it again without options

The source: NVIDIA's "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html and its spreadsheet), read through
leptonai/gpud's generated copy of that spreadsheet's "Catalog" sheet (the .tsv's header says which commit).

Our grade is a policy on NVIDIA's "Resolution Bucket (Immediate Action)": ``BUCKET_GRADES`` below, one row per
bucket with the reason; a bucket without a row stops the generator (a new bucket needs a decision, not a
default). ``HAND_GRADES`` keeps the few grades decided here before the catalog was data, where they differ
from what the bucket alone gives, each with its reason.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

from gna_types.policy import Severity, SuggestedAction

HERE = Path(__file__).resolve().parent
TSV = HERE / "data" / "nvidia_xid_catalog.tsv"
OUT = HERE / "xid_catalog_data.py"
COLUMNS = ("code", "mnemonic", "description", "immediate", "investigatory")


class Grade(NamedTuple):
    severity: Severity
    action: SuggestedAction
    fatal: bool  # reset/reboot class: raises GPUFatalXid until the GPU is trusted again
    why: str


# NVIDIA's immediate-action bucket -> our grade. `cordon` only where NVIDIA says the GPU itself must be reset
# (or the node rebooted) before it is used again; an application's fault never cordons; hardware that may be at
# fault (or an Xid NVIDIA says to raise with support) is inspect_hardware, never a cordon on its own.
BUCKET_GRADES: dict[str, Grade] = {
    "IGNORE": Grade("info", "none", False, "NVIDIA: no action; reported for the record"),
    "RESTART_APP": Grade("warning", "none", False, "the application restarts; the node is fine"),
    "WORKFLOW_XID_45": Grade("warning", "none", False, "follows another Xid (Not Solo: IGNORE); that Xid grades"),
    "RESET_GPU": Grade("critical", "cordon", True, "the GPU needs a reset before it is used again"),
    "WORKFLOW_XID_48": Grade("critical", "cordon", True, "double-bit ECC: drain, then reset (or RMA by count)"),
    "WORKFLOW_NVLINK_ERR": Grade("critical", "cordon", True, "NVLink error: drain and follow NVIDIA's workflow"),
    "WORKFLOW_NVLINK5_ERR": Grade("critical", "cordon", True,
                                  "NVLink5 error; the firmware's own Fatal/Nonfatal word grades it when logged"),
    "RESTART_BM": Grade("critical", "reboot", True, "the node (bare metal) must be restarted"),
    "RESTART_VM": Grade("critical", "reboot", True, "the VM must be restarted"),
    "CHECK_MECHANICALS": Grade("critical", "inspect_hardware", False, "a cable or power connector to check"),
    "CONTACT_SUPPORT": Grade("warning", "inspect_hardware", False,
                             "unused or unexpected Xid: NVIDIA asks to contact support"),
    "UPDATE_SWFW": Grade("warning", "fix_config", False, "update the driver or firmware"),
    "CHECK_UVM": Grade("warning", "inspect_hardware", False, "check the UVM/C2C path; no reset named"),
    "XID_154": Grade("warning", "inspect_hardware", False,
                     "the new recovery action is in the line's text; without it, unknown"),
    "": Grade("warning", "inspect_hardware", False, "the catalog names no action yet: never a cordon on a guess"),
    # Xid 154's recovery actions (the driver's _gpuRecoveryActionName), as buckets of their own
    "DRAIN_P2P": Grade("critical", "cordon", False, "Xid 154: drain peer-to-peer work from this GPU"),
    "RECOVER_IMEX_DOMAIN": Grade("warning", "inspect_hardware", False,
                                 "Xid 154: the IMEX domain needs recovery; not this GPU's fault alone"),
}

# Grades decided before the catalog was data, kept where they differ from the bucket's.
HAND_GRADES: dict[int, tuple[Grade, bool]] = {  # code -> (grade, application error)
    13: (Grade("warning", "none", False, "application fault (one crashing job shows it on many nodes)"), True),
    31: (Grade("warning", "none", False, "application fault (illegal address)"), True),
    43: (Grade("warning", "none", False, "application stopped (catalog: IGNORE); kept a warning"), True),
    45: (Grade("warning", "none", False, "preemptive cleanup after another Xid (catalog: WORKFLOW_XID_45)"), True),
    68: (Grade("warning", "none", False, "video decoder exception in the application"), True),
    61: (Grade("critical", "inspect_hardware", False,
                "micro-controller breakpoint (catalog: Unused, CONTACT_SUPPORT); kept critical"), False),
}


class Row(NamedTuple):
    code: int
    mnemonic: str
    description: str
    immediate: str
    investigatory: str


def _unescape(field: str) -> str:
    return str(json.loads('"' + field + '"'))  # the fields keep the Go/JSON escapes (\n, \", \\) as written


def read_tsv(path: Path = TSV) -> tuple[list[str], list[Row]]:
    header: list[str] = []
    rows: list[Row] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            header.append(line)
            continue
        if not line.strip():
            continue
        parts = line.split("\t")
        if parts[0] == "code":
            continue
        if len(parts) != len(COLUMNS):
            raise SystemExit(f"{path}: {len(parts)} fields, want {len(COLUMNS)}: {line[:80]}")
        code, *text = parts
        rows.append(Row(int(code), *(_unescape(t) for t in text)))
    codes = [r.code for r in rows]
    if len(set(codes)) != len(codes):
        raise SystemExit(f"{path}: a code appears twice")
    return header, rows


def short_name(row: Row) -> str:
    """The message's name: the catalog's description up to its first remark (" -- ", a newline's
    parenthesis kept on one line); an "Unused" Xid by its mnemonic."""
    text = " ".join(row.description.split(" -- ")[0].split())
    if text in ("", "Unused"):
        mnemonic = " ".join(row.mnemonic.split())
        return f"{mnemonic} (unused in NVIDIA's catalog)"
    return text[:200]


def grade_of(row: Row) -> tuple[Grade, bool, str]:
    if row.code in HAND_GRADES:
        grade, application = HAND_GRADES[row.code]
        return grade, application, "hand"
    bucket = row.immediate.strip()
    if bucket not in BUCKET_GRADES:
        raise SystemExit(f"Xid {row.code}: NVIDIA's bucket {bucket!r} has no grade: add it to BUCKET_GRADES")
    return BUCKET_GRADES[bucket], False, "bucket"


def render(header: list[str], rows: list[Row]) -> str:
    out = [
        '"""NVIDIA\'s Xid catalog with this agent\'s grade for every Xid in it. GENERATED by',
        "``python -m collectors.formats.xid_catalog_generate`` from collectors/formats/data/nvidia_xid_catalog.tsv",
        "(the grades: BUCKET_GRADES and HAND_GRADES there); do not edit. tests/test_xid_catalog.py keeps it equal.",
        "",
        "Source (the .tsv's provenance header):",
        *(f"    {h.lstrip('#').strip()}" for h in header if h.lstrip("#").strip()),
        '"""',
        "# ruff: noqa: E501",
        "",
        "from __future__ import annotations",
        "",
        "from typing import NamedTuple",
        "",
        "from gna_types.policy import Severity, SuggestedAction",
        "",
        "",
        "class XidEntry(NamedTuple):",
        "    code: int",
        "    mnemonic: str  # NVIDIA's mnemonic (nverror.h's name)",
        "    name: str  # the catalog's description, short: the message's name",
        "    immediate: str  # NVIDIA's Resolution Bucket (Immediate Action); \"\" where the catalog gives none",
        "    investigatory: str  # NVIDIA's Resolution Bucket (Investigatory Action)",
        "    severity: Severity",
        "    action: SuggestedAction",
        "    fatal: bool  # reset/reboot class: GPUFatalXid",
        "    application: bool  # the application's fault: never a cordon",
        "    graded_by: str  # \"bucket\" (BUCKET_GRADES) or \"hand\" (HAND_GRADES)",
        "",
        "",
        "class BucketGrade(NamedTuple):",
        "    severity: Severity",
        "    action: SuggestedAction",
        "    fatal: bool",
        "",
        "",
        "BUCKET_GRADES: dict[str, BucketGrade] = {",
    ]
    for bucket, g in BUCKET_GRADES.items():
        out.append(f"    {bucket!r}: BucketGrade({g.severity!r}, {g.action!r}, {g.fatal!r}),  # {g.why}")
    out += ["}", "", "CATALOG: dict[int, XidEntry] = {"]
    for row in sorted(rows):
        g, application, by = grade_of(row)
        out.append(f"    {row.code}: XidEntry({row.code}, {' '.join(row.mnemonic.split())!r}, {short_name(row)!r}, "
                   f"{row.immediate.strip()!r}, {' '.join(row.investigatory.split())!r}, {g.severity!r}, "
                   f"{g.action!r}, {g.fatal!r}, {application!r}, {by!r}),")
    out += ["}", ""]
    return "\n".join(out)


# -- refreshing the .tsv from gpud's generated Go table (its string fields, read as data) --------------------
_GO_ROW = re.compile(r'\{Code: (\d+), Mnemonic: "((?:[^"\\]|\\.)*)", Description: "((?:[^"\\]|\\.)*)", '
                     r'ImmediateResolution: "((?:[^"\\]|\\.)*)", InvestigatoryResolution: "((?:[^"\\]|\\.)*)"\}')
_GO_STAMP = re.compile(r"Generated at (\S+)\. Source: (\S+)")


def import_gpud(go_file: Path, commit: str) -> str:
    text = go_file.read_text(encoding="utf-8")
    stamp = _GO_STAMP.search(text)
    rows = _GO_ROW.findall(text.split("var nvlinkRules")[0])
    if not rows:
        raise SystemExit(f"{go_file}: no catalogEntries rows")
    head = [
        "# NVIDIA Xid catalog: the \"Catalog\" sheet of NVIDIA's Xid catalog spreadsheet, one Xid a row.",
        f"# NVIDIA's page: {stamp.group(2) if stamp else 'https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html'}",
        "# Read through: leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go "
        f"(commit {commit}; gpud generated it from that page's spreadsheet at {stamp.group(1) if stamp else '?'}).",
        "# Fields: each catalogEntries row's Code, Mnemonic, Description, ImmediateResolution, "
        "InvestigatoryResolution as written there (Go string escapes kept), tab-separated.",
        "# Regenerate: python -m collectors.formats.xid_catalog_generate --import-gpud <file> --commit <sha>; "
        "then python -m collectors.formats.xid_catalog_generate",
        "\t".join(COLUMNS),
    ]
    for r in rows:
        if any("\t" in f for f in r):
            raise SystemExit("a field holds a tab")
    return "\n".join([*head, *("\t".join(r) for r in rows)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--check", action="store_true", help="exit 1 when xid_catalog_data.py differs")
    ap.add_argument("--import-gpud", type=Path, help="rewrite the .tsv from gpud's catalog_generated.go")
    ap.add_argument("--commit", default="?", help="the gpud commit the --import-gpud file is from")
    args = ap.parse_args(argv)
    if args.import_gpud:
        TSV.write_text(import_gpud(args.import_gpud, args.commit), encoding="utf-8")
        print(f"wrote {TSV}")
        return 0
    text = render(*read_tsv())
    if args.check:
        if not OUT.is_file() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} differs from what {TSV.name} generates: python -m collectors.formats.xid_catalog_generate",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
