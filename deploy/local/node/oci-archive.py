#!/usr/bin/env python3
"""An OCI image archive of one static executable, named by its index (containerd's
io.containerd.image.name), so `ctr images import` names it without flags. Used by
deploy/local/node.sh for the local node's pod-sandbox ("pause") image.

  oci-archive.py EXECUTABLE PATH-IN-IMAGE REFERENCE OUT.tar
"""

import hashlib
import io
import json
import sys
import tarfile


def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def main():
    exe, path, ref, out = sys.argv[1:5]
    with open(exe, "rb") as f:
        data = f.read()
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        info = tarfile.TarInfo(path.strip("/"))
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        t.addfile(info, io.BytesIO(data))
    layer = layer_buf.getvalue()
    config = canonical({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [path], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [blob(layer)]},
    })
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": blob(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": blob(layer), "size": len(layer)}],
    })
    index = canonical({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": blob(manifest), "size": len(manifest),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"io.containerd.image.name": ref,
                            "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[-1]},
        }],
    })
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
        def add(name, content):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(content), 0
            t.addfile(info, io.BytesIO(content))
        add("oci-layout", canonical({"imageLayoutVersion": "1.0.0"}))
        add("index.json", index)
        for content in (layer, config, manifest):
            add("blobs/sha256/" + blob(content).split(":", 1)[1], content)


if __name__ == "__main__":
    main()
