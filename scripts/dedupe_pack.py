#!/usr/bin/env python3
"""Packs a bundle folder for the trip to the GPU machine, storing the embedded PTX once.

Every test and bench binary embeds the same PTX (tens of MB): gzip's 32 KiB window cannot see the
repeats across files, so a plain tar.gz of the bundle outgrows the transfer limit. `pack` cuts every
occurrence of the PTX files (bundle/ptx/*.ptx) out of every file, records where, and writes one
tar.gz; `unpack` puts the bytes back and checks each file's SHA-256.

  python3 scripts/dedupe_pack.py pack BUNDLE_DIR OUT.tgz
  python3 scripts/dedupe_pack.py unpack IN.tgz DEST_DIR     (DEST_DIR/bundle is recreated)
"""
import hashlib, io, json, os, sys, tarfile


def pack(bundle, out):
    blobs = []
    for name in sorted(os.listdir(os.path.join(bundle, "ptx"))):
        with open(os.path.join(bundle, "ptx", name), "rb") as f:
            blobs.append(f.read())
    index = {"blobs": len(blobs), "files": []}
    with tarfile.open(out, "w:gz", compresslevel=6) as tar:
        def add(arcname, data, mode=0o644):
            info = tarfile.TarInfo(arcname)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for i, b in enumerate(blobs):
            add(f"blob{i}", b)
        for root, _, files in os.walk(bundle):
            for fname in sorted(files):
                path = os.path.join(root, fname)
                rel = os.path.relpath(path, bundle)
                with open(path, "rb") as f:
                    data = f.read()
                cuts = []  # (offset in the original, blob id), in increasing offset
                if not rel.startswith("ptx" + os.sep):
                    for i, b in enumerate(blobs):
                        start = 0
                        while (at := data.find(b, start)) >= 0:
                            cuts.append((at, i))
                            start = at + len(b)
                cuts.sort()
                stripped, pos = bytearray(), 0
                for at, i in cuts:
                    stripped += data[pos:at]
                    pos = at + len(blobs[i])
                stripped += data[pos:]
                index["files"].append({"path": rel, "cuts": cuts, "mode": os.stat(path).st_mode & 0o777,
                                       "sha256": hashlib.sha256(data).hexdigest()})
                add("files/" + rel, bytes(stripped), os.stat(path).st_mode & 0o777)
        add("index.json", json.dumps(index).encode())


def unpack(src, dest):
    with tarfile.open(src, "r:gz") as tar:
        index = json.load(tar.extractfile("index.json"))
        blobs = [tar.extractfile(f"blob{i}").read() for i in range(index["blobs"])]
        for entry in index["files"]:
            stripped = tar.extractfile("files/" + entry["path"]).read()
            data, pos, done = bytearray(), 0, 0  # pos: in stripped; done: bytes of the original so far
            for at, i in entry["cuts"]:
                take = at - done
                data += stripped[pos:pos + take]
                pos += take
                data += blobs[i]
                done = at + len(blobs[i])
            data += stripped[pos:]
            if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                sys.exit(f"unpack: {entry['path']} does not match its checksum")
            path = os.path.join(dest, "bundle", entry["path"])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            os.chmod(path, entry["mode"])


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    (pack if sys.argv[1] == "pack" else unpack)(sys.argv[2], sys.argv[3])
