#!/usr/bin/env python3
"""Assembles the address-controller OCI image archive without a container engine.

Input: the release binaries, the Debian packages of the run-time root (libc6,
libgcc-s1 and its gcc-12-base, ca-certificates) as .deb files, the Cargo workspace.
Output, in --out:
  <name>-<version>.oci.tar     an OCI image layout as a tar (skopeo's `oci-archive:`)
  <name>-<version>.spdx.json   the SPDX 2.3 SBOM of the image (Debian packages + crates)
  <name>-<version>.digest      the manifest digest (sha256:...)

Reproducible: every file's owner is 0:0, its time SOURCE_DATE_EPOCH, entries are sorted,
gzip carries no name or time, and JSON is written with sorted keys. The same inputs give
the same digest; build.sh makes the inputs (binaries, packages) the same for one commit.
Called by deploy/image/build.sh (`make image`); not meant to be run by hand.
"""

import argparse
import datetime
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tomllib

# The run-time root: which files of each Debian package the image keeps. Everything else a
# package ships (iconv modules, manuals, maintainer scripts, the CA tool) is left out.
KEEP = {
    "libc6": ("lib/x86_64-linux-gnu/", "lib64/", "usr/share/doc/libc6/copyright"),
    "libgcc-s1": ("lib/x86_64-linux-gnu/libgcc_s.so.1", "usr/share/doc/libgcc-s1"),
    "gcc-12-base": ("usr/share/doc/gcc-12-base/copyright",),
    "ca-certificates": ("usr/share/doc/ca-certificates/copyright",),
}
CA_DIR = "usr/share/ca-certificates/"
CA_BUNDLE = "etc/ssl/certs/ca-certificates.crt"
UID = 65532
USER = "nonroot"


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


class Layer:
    """A layer's entries by path; written sorted, owned by root, at one time."""

    def __init__(self, epoch):
        self.epoch = epoch
        self.entries = {}

    def _parents(self, path):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d not in self.entries:
                self.add_dir(d)

    def add_dir(self, path, mode=0o755):
        path = path.strip("/")
        self._parents(path)
        info = tarfile.TarInfo(path)
        info.type = tarfile.DIRTYPE
        info.mode = mode
        self.entries[path] = (info, None)

    def add_file(self, path, data, mode=0o644):
        path = path.strip("/")
        self._parents(path)
        info = tarfile.TarInfo(path)
        info.size = len(data)
        info.mode = mode
        self.entries[path] = (info, data)

    def add_symlink(self, path, target):
        path = path.strip("/")
        self._parents(path)
        info = tarfile.TarInfo(path)
        info.type = tarfile.SYMTYPE
        info.linkname = target
        info.mode = 0o777
        self.entries[path] = (info, None)

    def tar(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            for path in sorted(self.entries):
                info, data = self.entries[path]
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = self.epoch
                t.addfile(info, io.BytesIO(data) if data is not None else None)
        return buf.getvalue()


def deb_fields(deb):
    out = subprocess.run(
        ["dpkg-deb", "--field", deb], check=True, capture_output=True
    ).stdout.decode()
    fields, key = {}, None
    for line in out.splitlines():
        if line.startswith((" ", "\t")) and key:
            fields[key] += "\n" + line
        elif ":" in line:
            key, value = line.split(":", 1)
            fields[key] = value.strip()
    return fields, out


def add_debs(layer, debs):
    """Adds the kept files of every package, the CA bundle and dpkg status entries;
    returns the packages' control fields."""
    packages = []
    certs = {}
    for deb in debs:
        fields, control = deb_fields(deb)
        name = fields["Package"]
        keep = KEEP.get(name)
        if keep is None:
            sys.exit(f"assemble.py: no rule for Debian package {name} ({deb})")
        fsys = subprocess.run(
            ["dpkg-deb", "--fsys-tarfile", deb], check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(fsys)) as t:
            for m in t.getmembers():
                path = m.name.lstrip("./")
                if name == "ca-certificates" and path.startswith(CA_DIR) and m.isfile():
                    certs[path] = t.extractfile(m).read()
                    continue
                if not path or not any(path == k.rstrip("/") or path.startswith(k) for k in keep):
                    continue
                if m.isdir():
                    layer.add_dir(path, m.mode)
                elif m.issym():
                    layer.add_symlink(path, m.linkname)
                elif m.isfile():
                    layer.add_file(path, t.extractfile(m).read(), m.mode)
        # Scanners (and people) find what is installed where distroless puts it.
        layer.add_file(f"var/lib/dpkg/status.d/{name}", control.encode())
        packages.append(fields)
    if certs:
        # What update-ca-certificates makes: every certificate, in path order.
        bundle = b"".join(
            c if c.endswith(b"\n") else c + b"\n" for _, c in sorted(certs.items())
        )
        layer.add_file(CA_BUNDLE, bundle)
    return packages


def base_layer(epoch, debs):
    layer = Layer(epoch)
    packages = add_debs(layer, debs)
    # The user the image runs as; no home (the root is read-only), no login shell.
    layer.add_file("etc/passwd", f"{USER}:x:{UID}:{UID}:{USER}:/:/sbin/nologin\n".encode())
    layer.add_file("etc/group", f"{USER}:x:{UID}:\n".encode())
    return layer, packages


def app_layer(epoch, binaries):
    layer = Layer(epoch)
    for src, dest in binaries:
        with open(src, "rb") as f:
            layer.add_file(dest, f.read(), 0o755)
    return layer


def gz(data):
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0, filename="") as g:
        g.write(data)
    return buf.getvalue()


def crates(workspace, binaries_pkgs):
    """The crates linked into the binaries: the normal-dependency closure of the binaries'
    packages, with licenses from cargo metadata and checksums from Cargo.lock."""
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--locked",
             "--filter-platform", "x86_64-unknown-linux-gnu"],
            cwd=workspace, check=True, capture_output=True,
        ).stdout
    )
    by_id = {p["id"]: p for p in meta["packages"]}
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    with open(os.path.join(workspace, "Cargo.lock"), "rb") as f:
        lock = tomllib.load(f)
    checksums = {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}
    roots = [p["id"] for p in meta["packages"] if p["name"] in binaries_pkgs and p["id"] in meta["workspace_members"]]
    seen, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        for d in nodes[pid]["deps"]:
            if any(k["kind"] is None for k in d["dep_kinds"]):
                todo.append(d["pkg"])
    out = []
    for pid in seen:
        p = by_id[pid]
        out.append({
            "name": p["name"],
            "version": p["version"],
            "license": p.get("license"),
            "workspace": pid in meta["workspace_members"],
            "checksum": checksums.get((p["name"], p["version"])),
        })
    return sorted(out, key=lambda c: (c["name"], c["version"]))


def spdx_license(expr):
    if not expr:
        return "NOASSERTION"
    # Old crates.io style "MIT/Apache-2.0" means either.
    return " OR ".join(part.strip() for part in expr.split("/")) if "/" in expr else expr


def sbom(args, digest, created, debs, crate_list):
    doc_name = f"{args.name}-{args.version}"

    def ref(kind, name, version):
        safe = "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in f"{name}-{version}")
        return f"SPDXRef-{kind}-{safe}"

    image = {
        "SPDXID": "SPDXRef-Image",
        "name": f"{args.repository}",
        "versionInfo": args.version,
        "downloadLocation": "NOASSERTION",
        "primaryPackagePurpose": "CONTAINER",
        "supplier": "NOASSERTION",
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": args.licenses,
        "copyrightText": "NOASSERTION",
        "filesAnalyzed": False,
        "checksums": [{"algorithm": "SHA256", "checksumValue": digest.split(":", 1)[1]}],
        "externalRefs": [{
            "referenceCategory": "PACKAGE-MANAGER",
            "referenceType": "purl",
            "referenceLocator": f"pkg:oci/{args.name}@{digest.replace(':', '%3A')}"
            f"?repository_url={args.repository.rsplit('/', 1)[0]}&tag={args.version}",
        }],
    }
    packages = [image]
    for f in debs:
        version, arch = f["Version"], f["Architecture"]
        packages.append({
            "SPDXID": ref("Deb", f["Package"], version),
            "name": f["Package"],
            "versionInfo": version,
            "supplier": "Organization: Debian",
            "downloadLocation": "NOASSERTION",
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "filesAnalyzed": False,
            "externalRefs": [{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": f"pkg:deb/debian/{f['Package']}@{version}?arch={arch}&distro=debian-12",
            }],
        })
    for c in crate_list:
        p = {
            "SPDXID": ref("Crate", c["name"], c["version"]),
            "name": c["name"],
            "versionInfo": c["version"],
            "supplier": "NOASSERTION",
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": spdx_license(c["license"]),
            "copyrightText": "NOASSERTION",
            "filesAnalyzed": False,
            "externalRefs": [{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": f"pkg:cargo/{c['name']}@{c['version']}",
            }],
        }
        if c["workspace"]:
            p["downloadLocation"] = f"git+{args.source}@{args.revision}"
        else:
            p["downloadLocation"] = f"https://crates.io/api/v1/crates/{c['name']}/{c['version']}/download"
            if c["checksum"]:
                p["checksums"] = [{"algorithm": "SHA256", "checksumValue": c["checksum"]}]
        packages.append(p)
    relationships = [{
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": "SPDXRef-Image",
    }] + [{
        "spdxElementId": "SPDXRef-Image",
        "relationshipType": "CONTAINS",
        "relatedSpdxElement": p["SPDXID"],
    } for p in packages[1:]]
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": doc_name,
        "documentNamespace": f"{args.source}/spdx/{doc_name}-{digest.split(':', 1)[1]}",
        "creationInfo": {"created": created, "creators": ["Tool: address-controller deploy/image/assemble.py"]},
        "documentDescribes": ["SPDXRef-Image"],
        "packages": packages,
        "relationships": relationships,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--repository", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--revision", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--licenses", required=True)
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--binary", action="append", default=[], help="SRC:DEST")
    ap.add_argument("--deb", action="append", default=[])
    ap.add_argument("--entrypoint", required=True)
    ap.add_argument("--cmd", action="append", default=[])
    args = ap.parse_args()

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    created = datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    binaries = [tuple(b.split(":", 1)) for b in args.binary]

    base, debs = base_layer(epoch, sorted(args.deb))
    app = app_layer(epoch, binaries)
    blobs = {}

    def blob(data):
        d = sha256(data)
        blobs[d] = data
        return d

    layers, diff_ids, history = [], [], []
    for what, layer in (("the run-time root: " + ", ".join(f"{d['Package']} {d['Version']}" for d in debs), base),
                        ("the binaries: " + ", ".join(dest for _, dest in binaries), app)):
        raw = layer.tar()
        packed = gz(raw)
        diff_ids.append(sha256(raw))
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                       "digest": blob(packed), "size": len(packed)})
        history.append({"created": created, "created_by": f"deploy/image/assemble.py: {what}"})

    labels = {
        "org.opencontainers.image.title": args.name,
        "org.opencontainers.image.source": args.source,
        "org.opencontainers.image.version": args.version,
        "org.opencontainers.image.revision": args.revision,
        "org.opencontainers.image.licenses": args.licenses,
        "org.opencontainers.image.created": created,
    }
    config = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{UID}:{UID}",
            "Entrypoint": [args.entrypoint],
            "Cmd": args.cmd,
            "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", f"SSL_CERT_FILE=/{CA_BUNDLE}"],
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        "history": history,
    }
    config_bytes = canonical_json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": blob(config_bytes), "size": len(config_bytes)},
        "layers": layers,
        "annotations": labels,
    }
    manifest_bytes = canonical_json(manifest)
    digest = blob(manifest_bytes)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest,
            "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            # The tag (OCI), and the full reference containerd names the image by on a
            # plain `ctr images import` (the chart's default image, no flags needed).
            "annotations": {
                "org.opencontainers.image.ref.name": args.version,
                "io.containerd.image.name": f"{args.repository}:{args.version}",
            },
        }],
    }
    archive = Layer(epoch)
    archive.add_file("oci-layout", canonical_json({"imageLayoutVersion": "1.0.0"}))
    archive.add_file("index.json", canonical_json(index))
    for d, data in blobs.items():
        archive.add_file(f"blobs/sha256/{d.split(':', 1)[1]}", data)

    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{args.name}-{args.version}")
    with open(stem + ".oci.tar", "wb") as f:
        f.write(archive.tar())
    bom = sbom(args, digest, created, debs, crates(args.workspace, {"address-controller", "address-controller-range-driver", "address-controller-metallb-driver", "address-controller-cilium-driver"}))
    with open(stem + ".spdx.json", "wb") as f:
        f.write(json.dumps(bom, sort_keys=True, indent=1).encode() + b"\n")
    with open(stem + ".digest", "w") as f:
        f.write(digest + "\n")
    files = sum(1 for info, _ in base.entries.values() if not info.isdir()) + \
        sum(1 for info, _ in app.entries.values() if not info.isdir())
    size = sum(l["size"] for l in layers)
    print(f"image   {args.repository}:{args.version}@{digest}")
    print(f"archive {stem}.oci.tar ({len(blobs)} blobs; layers {size} bytes compressed, "
          f"{sum(len(l.tar()) for l in (base, app))} uncompressed; {files} files and links in the root)")
    print(f"sbom    {stem}.spdx.json ({len(bom['packages']) - 1} packages: {len(debs)} Debian, "
          f"{len(bom['packages']) - 1 - len(debs)} crates)")


if __name__ == "__main__":
    main()
