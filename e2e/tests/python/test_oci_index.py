"""e2e/images/oci-index, which makes each release image's OCI index of its platforms: the index
names each platform's image by digest with the platform its config declares, and an image
tagged for one platform but built for another (an amd64 image listed as arm64, which an arm64
node would pull and fail to run) is refused, naming both, with the layout left as it was."""

import hashlib
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "e2e/images/oci-index"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def blob(layout: Path, body: bytes) -> dict:
    digest = hashlib.sha256(body).hexdigest()
    (layout / "blobs/sha256" / digest).write_bytes(body)
    return {"digest": f"sha256:{digest}", "size": len(body)}


def layout_with(tmp_path: Path, images: dict[str, str]) -> Path:
    """An OCI layout holding one empty image per tag, each built for linux/<arch>."""
    layout = tmp_path / "layout"
    (layout / "blobs/sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    manifests = []
    for tag, arch in images.items():
        config = blob(layout, json.dumps({"os": "linux", "architecture": arch, "rootfs": {"type": "layers", "diff_ids": []}}).encode())
        manifest = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST,
                               "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config},
                               "layers": []}).encode()
        manifests.append({"mediaType": MANIFEST, **blob(layout, manifest),
                          "annotations": {"org.opencontainers.image.ref.name": tag}})
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": manifests}))
    return layout


def run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=30)


def test_the_index_names_each_platforms_image(tmp_path):
    layout = layout_with(tmp_path, {"amd64": "amd64", "arm64": "arm64"})
    images = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in json.loads((layout / "index.json").read_text())["manifests"]}
    done = run(layout, "1.2.3", "amd64", "arm64")
    assert done.returncode == 0, done.stderr
    tagged = [m for m in json.loads((layout / "index.json").read_text())["manifests"]
              if m["annotations"]["org.opencontainers.image.ref.name"] == "1.2.3"]
    assert len(tagged) == 1 and tagged[0]["mediaType"] == "application/vnd.oci.image.index.v1+json"
    body = (layout / "blobs/sha256" / tagged[0]["digest"].split(":")[1]).read_bytes()
    assert hashlib.sha256(body).hexdigest() == tagged[0]["digest"].split(":")[1] and len(body) == tagged[0]["size"]
    index = json.loads(body)
    assert [(m["platform"], m["digest"]) for m in index["manifests"]] == [
        ({"architecture": "amd64", "os": "linux"}, images["amd64"]["digest"]),
        ({"architecture": "arm64", "os": "linux"}, images["arm64"]["digest"]),
    ]
    # The same tag again is refused (an index is made once per release).
    assert run(layout, "1.2.3", "amd64").returncode == 1


def test_an_image_built_for_another_platform_than_its_tag_is_refused(tmp_path):
    layout = layout_with(tmp_path, {"amd64": "amd64", "arm64": "amd64"})
    before = (layout / "index.json").read_text()
    done = run(layout, "1.2.3", "amd64", "arm64")
    assert done.returncode == 1
    assert done.stderr.strip() == f"{layout}: the image tagged arm64 is built for linux/amd64", done.stderr
    assert (layout / "index.json").read_text() == before
    missing = run(layout, "1.2.3", "s390x")
    assert missing.returncode == 1 and "no image tagged s390x" in missing.stderr
