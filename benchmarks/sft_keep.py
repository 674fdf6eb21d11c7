"""Keep the learning benchmark's SFT agents for a later run, and put them back.

SFT with its evaluations takes about 10 of a seed's 25 minutes on an H100. Every later run that starts from the same SFT (the same
recipe, seeds and data) can skip that part: ``pack`` writes each seed's SFT adapters and its SFT
record (``partial.json`` reduced to the stages measured before GRPO) into one tar, split into
chunks of a fixed size (easy to copy between machines); ``restore`` checks the chunks against the
manifest, joins them and unpacks them into a fresh output folder. ``multiminddev train --resume
SEED_DIR`` (with the run's settings) then loads the finished SFT adapters instead of training
them again; the held-out evaluations are measured again.

    python3 benchmarks/sft_keep.py pack /root/learning /root/sft_keep --seeds 0 1 2
    python3 benchmarks/sft_keep.py restore /root/stage_sft /root/learning
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

ROLES = ("generator", "optimizer")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# stages measured with SFT's agents before any GRPO step
SFT_STAGES = ("sft", "train_sft", "select@0")
RECORD_KEYS = ("seed", "sft_problems", "sft_recipe", "sft_losses", "train_eval_problems",
               "eval_settings")
CHUNK_PREFIX = "sft.tar.part_"
MANIFEST = "sft.tar.manifest.json"  # chunk count, size and sha256 of the whole tar
# Chunks stay under 16 MiB, a common per-file limit of file stores; three seeds' fp32 adapters
# (6 x 19.6 MB) make 9 chunks.
CHUNK_BYTES = 13 * 2**20


class KeepError(RuntimeError):
    """A seed folder without SFT agents, a torn chunk set, or a folder that would be overwritten."""


def sft_record(partial: dict[str, Any]) -> dict[str, Any]:
    """The part of a seed's partial.json that belongs to SFT: its recipe, losses, time, and the
    rows of the stages measured with SFT's agents."""
    rows = {k: v for k, v in partial.get("rows", {}).items() if k in SFT_STAGES}
    seconds = {k: v for k, v in partial.get("seconds", {}).items()
               if k == "sft" or k.removeprefix("eval_") in SFT_STAGES}
    return {**{k: partial[k] for k in RECORD_KEYS if k in partial}, "rows": rows,
            "seconds": seconds}


def pack(output_dir: Path, dest: Path, seeds: list[int], chunk_bytes: int = CHUNK_BYTES
         ) -> list[Path]:
    """Writes ``dest/sft.tar.part_aa``, ``_ab``, ...: the seeds' SFT adapters and records."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for seed in seeds:
            seed_dir = output_dir / f"seed{seed}"
            for role in ROLES:
                for name in ADAPTER_FILES:
                    path = seed_dir / "sft_checkpoints" / role / name
                    if not path.is_file():
                        raise KeepError(f"{path} is missing: seed {seed} has no finished SFT")
                    tar.add(path, arcname=f"seed{seed}/sft_checkpoints/{role}/{name}")
            partial_path = seed_dir / "partial.json"
            partial = json.loads(partial_path.read_text()) if partial_path.is_file() else {}
            data = json.dumps(sft_record(partial), indent=1).encode()
            info = tarfile.TarInfo(f"seed{seed}/partial.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob(f"{CHUNK_PREFIX}*"):
        old.unlink()
    blob, chunks = buffer.getvalue(), []
    for i, start in enumerate(range(0, len(blob), chunk_bytes)):
        chunk = dest / f"{CHUNK_PREFIX}{chr(97 + i // 26)}{chr(97 + i % 26)}"
        chunk.write_bytes(blob[start:start + chunk_bytes])
        chunks.append(chunk)
    (dest / MANIFEST).write_text(json.dumps({"chunks": len(chunks), "bytes": len(blob),
                                             "sha256": hashlib.sha256(blob).hexdigest(),
                                             "seeds": seeds}))
    return chunks


def restore(chunk_dir: Path, output_dir: Path) -> list[str]:
    """Joins ``chunk_dir``'s chunks and unpacks them into ``output_dir``; returns the seed
    folders written. A seed folder that already holds a partial.json or SFT adapters is not
    overwritten (KeepError), and nothing is written then."""
    chunks = sorted(chunk_dir.glob(f"{CHUNK_PREFIX}*"))
    if not chunks or not (chunk_dir / MANIFEST).is_file():
        raise KeepError(f"no {CHUNK_PREFIX}* files and {MANIFEST} in {chunk_dir}")
    manifest = json.loads((chunk_dir / MANIFEST).read_text())
    blob = b"".join(c.read_bytes() for c in chunks)
    if (len(chunks), len(blob), hashlib.sha256(blob).hexdigest()) != (
            manifest["chunks"], manifest["bytes"], manifest["sha256"]):
        raise KeepError(f"{len(chunks)} chunks of {len(blob)} bytes in {chunk_dir}, but "
                        f"{MANIFEST} says {manifest['chunks']} of {manifest['bytes']} bytes (or "
                        "another sha256): one is missing or cut")
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
            members = tar.getmembers()
            seeds = sorted({m.name.split("/", 1)[0] for m in members})
            for seed_dir in seeds:
                target = output_dir / seed_dir
                if (target / "partial.json").exists() or (target / "sft_checkpoints").exists():
                    raise KeepError(f"{target} already holds a run: restore into a fresh folder")
            output_dir.mkdir(parents=True, exist_ok=True)
            tar.extractall(output_dir, filter="data")  # "data": no links, no paths outside
    except (tarfile.TarError, EOFError) as exc:
        raise KeepError(f"the chunks in {chunk_dir} do not make a tar ({exc})") from exc
    return seeds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    k = sub.add_parser("pack", help="SFT adapters and records of OUTPUT_DIR's seeds -> chunks")
    k.add_argument("output_dir", type=Path)
    k.add_argument("dest", type=Path)
    k.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r = sub.add_parser("restore", help="chunks -> seed folders of a fresh OUTPUT_DIR")
    r.add_argument("chunk_dir", type=Path)
    r.add_argument("output_dir", type=Path)
    a = p.parse_args(argv)
    try:
        if a.command == "pack":
            chunks = pack(a.output_dir, a.dest, a.seeds)
            print(f"{len(chunks)} chunks in {a.dest}: "
                  + ", ".join(f"{c.name} ({c.stat().st_size / 2**20:.1f} MiB)" for c in chunks))
        else:
            print(f"restored {', '.join(restore(a.chunk_dir, a.output_dir))} into {a.output_dir}")
    except KeepError as exc:
        print(f"sft_keep: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
